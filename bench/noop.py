"""The best any networked store could reach: a no-op RPC against the adapter's server.

`grpc.health.v1.Health/Check` does no work on the server, so its rate at a client
count is what one network hop and gRPC's two ends cost alone. The framework sections
put it beside the in-process default they compare an adapter with: when even the
no-op's ratio to that default is under a goal ("no slower than 2x at 8 clients"), the
hop alone rules the goal out, whatever the store does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.stats import Measurement, Window, summarise

NAME = "no-op RPC (Health/Check)"
_TIMEOUT_S = 30.0


def health_checks(address: str, clients: int, seconds: float, warmup_s: float) -> Measurement:
    """Health/Check back to back from `clients` threads sharing one channel (as an
    adapter's sessions share one client), counted over one window; a failed check
    raises here."""
    started = time.perf_counter()
    windows = [Window(warmup_s, seconds, started) for _ in range(clients)]
    failures: list[grpc.RpcError] = []
    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        request = health_pb2.HealthCheckRequest(service="")

        def client(window: Window) -> None:
            while window.open() and not failures:
                began = time.perf_counter()
                try:
                    check(request, timeout=_TIMEOUT_S)
                except grpc.RpcError as error:
                    failures.append(error)
                    return
                if not window.record(began, time.perf_counter()):
                    return

        # Each thread counts in a window of its own (no shared counter to race on),
        # all opened at the same moment; their counts add up below.
        threads = [threading.Thread(target=client, args=(window,)) for window in windows]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    if failures:
        raise RuntimeError(f"{NAME} failed on {address}: {failures[0]}") from failures[0]
    latencies = [latency for window in windows for latency in window.latencies]
    completed = sum(window.completed for window in windows)
    measurement = summarise(NAME, clients, seconds, latencies, completed)
    measurement.rpcs_per_cycle = 1
    return measurement


def perspective(noop: Measurement, server: str, defaults: Sequence[tuple[str, float]]) -> str:
    """The line a section prints: the no-op's rate at its client count on `server`, and
    its ratio to each in-process default's rate (name, per second) at that count."""
    clients = noop.clients
    ratios = ", ".join(
        f"{noop.cycles_per_s / rate:.2f}x {name}" if rate > 0 else f"- {name}"
        for name, rate in defaults
    )
    against = (
        f" = {ratios} (the best any networked store could reach)"
        if ratios
        else " (no in-process default measured beside it)"
    )
    rate = f"{noop.cycles_per_s:,.0f}/s"
    return f"{NAME}, {clients} client{'s' * (clients > 1)}, {server} server: {rate}{against}"
