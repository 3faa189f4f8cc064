"""The load generator: delivery cycles over gRPC from N coroutines (grpc.aio).

Run as its own process (the runner does this), never inside the server's:

    python -m bench.delivery_cycle --address 127.0.0.1:PORT --clients 8 --seconds 10

Each client coroutine registers one gateway instance, then repeats the send
path a gateway runs for every final reply: RecordObligation (unique content)
→ MarkAttempting → MarkDelivered, each awaited before the next. The clients
share one channel (or `--channels` channels, round robin, each with its own
HTTP/2 connection). The first `--warmup` seconds are not counted; a cycle counts
when it ends inside the window, its latency when it also started inside it.
Prints one JSON object on stdout.

`--rpc noop` replaces each cycle by three `grpc.health.v1.Health/Check` calls
on the same server: a handler that touches no database, so its rate is the
ceiling the gRPC layer alone (server and this client) allows on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.request_ids import request_id
from bench.stats import STEPS_PER_CYCLE, summarise
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc

#: Per-RPC deadline: a stuck call ends the client, never the whole run.
RPC_TIMEOUT_S = 10.0
#: Lease asked for at registration: longer than any measurement.
LEASE_TTL_S = 3600


@dataclass
class ClientResult:
    latencies: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str = ""


def _only_127(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"refusing to load a server that is not on 127.0.0.1: {address}")
    return address


async def register_instance(stub: pb_grpc.DeliveryServiceAsyncStub) -> str:
    """Registers one gateway instance (a lease longer than any measurement); its id."""
    registered = await stub.RegisterInstance(
        pb.RegisterInstanceRequest(
            gateway_name="bench-gateway",
            host="bench",
            pid=os.getpid(),
            platforms=["slack"],
            lease_ttl=duration_pb2.Duration(seconds=LEASE_TTL_S),
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return registered.instance.instance_id


async def send_cycle(
    stub: pb_grpc.DeliveryServiceAsyncStub,
    instance_id: str,
    client: int,
    tag: str,
    i: int,
    begin_attempt: bool = False,
) -> None:
    """One send path: RecordObligation (content unique per `tag`, `client`, `i`) →
    MarkAttempting → MarkDelivered. `begin_attempt` records straight into ATTEMPTING:
    the same three transitions in two RPCs (RecordObligation.begin_attempt)."""
    recorded = await stub.RecordObligation(
        pb.RecordObligationRequest(
            instance_id=instance_id,
            session_key=f"agent:bench:slack:channel:C{client}",
            message_ref=f"{tag}-{i}",
            content=f"bench {client} {i}",
            platform="slack",
            chat_id=f"C{client}",
            thread_id="171.001",
            begin_attempt=begin_attempt,
            request_id=request_id(),
        ),
        timeout=RPC_TIMEOUT_S,
    )
    row = recorded.obligation
    if not recorded.created:
        raise RuntimeError(f"obligation {row.id} existed already: contents not unique")
    if not begin_attempt:
        await stub.MarkAttempting(
            pb.MarkAttemptingRequest(
                obligation_id=row.id,
                instance_id=instance_id,
                fence=row.fence,
                request_id=request_id(),
            ),
            timeout=RPC_TIMEOUT_S,
        )
    delivered = await stub.MarkDelivered(
        pb.MarkDeliveredRequest(
            obligation_id=row.id,
            instance_id=instance_id,
            fence=row.fence,
            platform_message_id=f"pm-{client}-{i}",
            request_id=request_id(),
        ),
        timeout=RPC_TIMEOUT_S,
    )
    if delivered.obligation.state != pb.OBLIGATION_STATE_DELIVERED:
        raise RuntimeError(f"obligation {row.id} is not delivered after MarkDelivered")


async def _client(
    stub: pb_grpc.DeliveryServiceAsyncStub,
    client: int,
    tag: str,
    measure_from: float,
    stop_at: float,
    begin_attempt: bool = False,
) -> ClientResult:
    """Registers an instance, then repeats `send_cycle` until `stop_at`."""
    result = ClientResult()
    try:
        instance_id = await register_instance(stub)
        i = 0
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                break
            await send_cycle(stub, instance_id, client, tag, i, begin_attempt)
            ended = time.perf_counter()
            i += 1
            if ended > stop_at:
                break
            if began >= measure_from:
                result.latencies.append(ended - began)
            if ended >= measure_from:
                result.completed += 1
    except (grpc.aio.AioRpcError, RuntimeError) as exc:
        result.errors += 1
        result.first_error = str(exc).strip().splitlines()[0][:300]
    return result


async def _noop_client(
    channel: grpc.aio.Channel, measure_from: float, stop_at: float
) -> ClientResult:
    """Cycles of three no-op RPCs (Health/Check), timed like delivery cycles."""
    result = ClientResult()
    check = health_pb2_grpc.HealthStub(channel).Check
    request = health_pb2.HealthCheckRequest(service="")
    try:
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                break
            for _ in range(STEPS_PER_CYCLE):
                await check(request, timeout=RPC_TIMEOUT_S)
            ended = time.perf_counter()
            if ended > stop_at:
                break
            if began >= measure_from:
                result.latencies.append(ended - began)
            if ended >= measure_from:
                result.completed += 1
    except grpc.aio.AioRpcError as exc:
        result.errors += 1
        result.first_error = str(exc).strip().splitlines()[0][:300]
    return result


async def run(
    address: str, clients: int, channels: int, seconds: float, warmup_s: float, rpc: str = "cycle"
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:8]  # contents stay unique across runs on one database
    opened = [
        grpc.aio.insecure_channel(
            _only_127(address),
            # A local subchannel pool gives every channel its own connection.
            options=[("grpc.use_local_subchannel_pool", 1)],
        )
        for _ in range(channels)
    ]
    try:
        for channel in opened:
            await asyncio.wait_for(channel.channel_ready(), timeout=RPC_TIMEOUT_S)
        stubs = [pb_grpc.DeliveryServiceStub(channel) for channel in opened]
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        wall_before = time.perf_counter()
        measure_from = wall_before + warmup_s
        stop_at = measure_from + seconds
        if rpc == "noop":
            coroutines = [
                _noop_client(opened[n % channels], measure_from, stop_at) for n in range(clients)
            ]
        else:
            coroutines = [
                _client(stubs[n % channels], n, tag, measure_from, stop_at, rpc == "cycle2")
                for n in range(clients)
            ]
        results = await asyncio.wait_for(
            asyncio.gather(*coroutines),
            timeout=warmup_s + seconds + 4 * RPC_TIMEOUT_S,
        )
        wall = time.perf_counter() - wall_before
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for channel in opened:
            await channel.close()
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    measurement = summarise(
        rpc,
        clients,
        seconds,
        [latency for result in results for latency in result.latencies],
        sum(result.completed for result in results),
        errors=sum(result.errors for result in results),
        channels=channels,
    )
    if rpc == "cycle2":
        measurement.rpcs_per_cycle = 2
    measurement.extra = {
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_wall_s": round(wall, 3),
        "loadgen_cpu_util": round(cpu / wall, 3) if wall > 0 else 0.0,
        "first_error": next((r.first_error for r in results if r.first_error), ""),
    }
    return measurement.to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of a DeliveryService")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument(
        "--rpc",
        choices=("cycle", "cycle2", "noop"),
        default="cycle",
        help="cycle: record/attempting/delivered (3 RPCs); cycle2: the same in 2 RPCs "
        "(record with begin_attempt, delivered); noop: 3 x Health/Check (gRPC ceiling)",
    )
    args = parser.parse_args(argv)
    if args.clients < 1 or args.channels < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("clients and channels must be >= 1, seconds > 0, warmup >= 0")
    result = asyncio.run(
        run(
            args.address,
            args.clients,
            min(args.channels, args.clients),
            args.seconds,
            args.warmup,
            args.rpc,
        )
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
