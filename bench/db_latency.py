"""Throughput against database latency: appends/s and delivery cycles/s at 8 clients on
Postgres with 0, 1, 5 and 20 ms of round trip added between the services and the database.

The latency comes from `tests.tcp_proxy.TcpProxy` on 127.0.0.1, in front of
postgresql://127.0.0.1:5432: its delay is per direction, so half the added round
trip each way. Each point gets a fresh schema and a fresh server process (`python -m
switchboard serve session|delivery`) whose database URL points at the proxy; the load
generators are the ones of the other sections (`bench.session_load --mode append`,
`bench.delivery_cycle`). Run alone with `python -m bench --only db-latency`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench import harness, servers
from bench.harness import log
from bench.stats import Measurement
from tests.tcp_proxy import TcpProxy

ADDED_ROUND_TRIPS_MS = (0.0, 1.0, 5.0, 20.0)
CLIENTS = 8


@dataclass(frozen=True)
class Point:
    added_rtt_ms: float
    appends: Measurement
    cycles: Measurement


def _proxied(url: str, proxy: TcpProxy) -> str:
    return url.replace("127.0.0.1:5432", proxy.address, 1)


def _measure(service: str, added_rtt_ms: float, seconds: float, warmup_s: float) -> Measurement:
    with (
        servers.temp_dir(f"bench-dblat-{service}-") as data_dir,
        servers.postgres_schema() as url,
        TcpProxy(("127.0.0.1", 5432), delay_s=added_rtt_ms / 2000) as proxy,
        servers.running_server(_proxied(url, proxy), data_dir, service=service) as srv,
    ):
        if service == "session":
            module = "bench.session_load"
            arguments = ["--mode", "append"]
        else:
            module = "bench.delivery_cycle"
            arguments = ["--rpc", "cycle"]
        arguments += [
            "--clients",
            str(CLIENTS),
            "--channels",
            "1",
            "--seconds",
            str(seconds),
            "--warmup",
            str(warmup_s),
        ]
        measurement = harness.run_loadgen(srv, module, arguments, warmup_s + seconds + 180)
    measurement.name = f"postgres +{added_rtt_ms:g} ms"
    return measurement


def measure(seconds: float, warmup_s: float) -> list[Point]:
    points = []
    for added in ADDED_ROUND_TRIPS_MS:
        appends = _measure("session", added, seconds, warmup_s)
        log(f"[db-latency] +{added:g} ms appends: {harness.describe(appends, 'appends')}")
        cycles = _measure("delivery", added, seconds, warmup_s)
        log(f"[db-latency] +{added:g} ms delivery: {harness.describe(cycles)}")
        points.append(Point(added, appends, cycles))
    return points


_HEADER = (
    f"{'added RTT':>10}{'appends/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
    f"{'cycles/s':>11}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}  vs +0 ms (appends, cycles)"
)


def _share(value: float, base: float) -> str:
    return f"{value / base:.3f}" if base > 0 else "n/a"


def render(points: list[Point]) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    base = points[0] if points else None
    for p in points:
        a, c = p.appends, p.cycles
        shares = (
            f"{_share(a.cycles_per_s, base.appends.cycles_per_s)}, "
            f"{_share(c.cycles_per_s, base.cycles.cycles_per_s)}"
            if base is not None
            else ""
        )
        lines.append(
            f"{f'+{p.added_rtt_ms:g} ms':>10}{a.cycles_per_s:>11,.1f}{a.p50_ms:>9.2f}"
            f"{a.p99_ms:>9.2f}{a.errors:>8}{c.cycles_per_s:>11,.1f}{c.p50_ms:>9.2f}"
            f"{c.p99_ms:>9.2f}{c.errors:>8}  {shares}"
        )
    lines.append(
        f"({CLIENTS} clients, 1 channel; the round trip is added by a TCP proxy between the "
        "server process and Postgres; a delivery cycle is RecordObligation -> MarkAttempting "
        "-> MarkDelivered)"
    )
    return "\n".join(lines)


def report(points: list[Point]) -> list[dict[str, Any]]:
    return [
        {
            "added_rtt_ms": p.added_rtt_ms,
            "clients": CLIENTS,
            "appends": p.appends.to_json(),
            "cycles": p.cycles.to_json(),
        }
        for p in points
    ]
