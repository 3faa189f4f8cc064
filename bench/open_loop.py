"""The open-loop load generator: operations started on a fixed schedule (grpc.aio).

Run as its own process (the runner does this), never inside the server's:

    python -m bench.open_loop --address 127.0.0.1:PORT --service delivery --op work --rate 500

Closed-loop clients wait for an answer before they send again, so a slow
server slows the load down and the latencies it reports hide the queue.
Here operation k is due at t0 + k / rate and is started at that moment
whether or not earlier ones have finished; its latency runs from when it was
*due*, so time spent waiting (in this process's event loop, in the server's
queues) counts. Operations due in the first `--warmup` seconds are not
measured; those due in the next `--seconds` are. The achieved rate counts
operations that finished successfully inside the measured window.

Operations (`--op work`):
- `--service delivery`: one delivery cycle, RecordObligation (unique content,
  over `CONVERSATIONS` session keys of one registered instance) →
  MarkAttempting → MarkDelivered, each awaited before the next (3 RPCs);
- `--service session`: one AppendEvents of one 100-byte USER message to one of
  `CONVERSATIONS` sessions of one agent, round robin (1 RPC).

`--op noop` replaces each operation by the same number of
`grpc.health.v1.Health/Check` calls (3 for delivery, 1 for session), in
sequence: the baseline of the gRPC layer at the same rate.

An operation taking longer than `OP_TIMEOUT_S` is cancelled and counted as an
error. Prints one JSON object (a `bench.stats.Measurement`) on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench import delivery_cycle, session_load
from bench.session_load import message_event
from bench.stats import percentile, summarise
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc

#: Deadline of one operation (all its RPCs), counted from when it started.
OP_TIMEOUT_S = 10.0
#: Delivery session keys / SessionService sessions the operations are spread over.
CONVERSATIONS = 32
#: RPCs per operation, by service.
RPCS = {"delivery": 3, "session": 1}

Operation = Callable[[int], Awaitable[None]]


@dataclass
class Outcome:
    due: float
    started: float = 0.0
    ended: float = 0.0
    ok: bool = False
    error: str = ""


@dataclass
class Tally:
    in_flight: int = 0
    max_in_flight: int = 0
    first_error: str = ""
    outcomes: list[Outcome] = field(default_factory=list)


def _only_127(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"refusing to load a server that is not on 127.0.0.1: {address}")
    return address


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"[:300]
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# -- operations -------------------------------------------------------------------------------


def noop_operation(channel: grpc.aio.Channel, calls: int) -> Operation:
    check = health_pb2_grpc.HealthStub(channel).Check
    request = health_pb2.HealthCheckRequest(service="")

    async def operation(_k: int) -> None:
        for _ in range(calls):
            await check(request, timeout=OP_TIMEOUT_S)

    return operation


async def delivery_operation(channel: grpc.aio.Channel) -> Operation:
    stub = dpb_grpc.DeliveryServiceStub(channel)
    instance_id = await delivery_cycle.register_instance(stub)
    tag = uuid.uuid4().hex[:8]  # contents stay unique across runs on one database

    async def operation(k: int) -> None:
        await delivery_cycle.send_cycle(stub, instance_id, k % CONVERSATIONS, tag, k)

    return operation


async def session_operation(channel: grpc.aio.Channel) -> Operation:
    stub = spb_grpc.SessionServiceStub(channel)
    agent = f"bench-{uuid.uuid4().hex[:12]}"  # unique on a database that outlives one run
    await session_load.create_agent(stub, agent)
    session_ids = [
        await session_load.resolve_session(stub, agent, f"open-{n}") for n in range(CONVERSATIONS)
    ]

    async def operation(k: int) -> None:
        conversation = k % CONVERSATIONS
        response = await stub.AppendEvents(
            spb.AppendEventsRequest(
                agent=agent,
                session_id=session_ids[conversation],
                events=[message_event(conversation, k)],
            ),
            timeout=OP_TIMEOUT_S,
        )
        if len(response.events) != 1:
            raise RuntimeError(f"append {k} answered {len(response.events)} events")

    return operation


# -- the schedule -----------------------------------------------------------------------------


async def _one(operation: Operation, k: int, outcome: Outcome, tally: Tally) -> None:
    outcome.started = time.perf_counter()
    tally.in_flight += 1
    tally.max_in_flight = max(tally.max_in_flight, tally.in_flight)
    try:
        await asyncio.wait_for(operation(k), timeout=OP_TIMEOUT_S)
        outcome.ok = True
    except (grpc.aio.AioRpcError, RuntimeError, TimeoutError) as exc:
        # wait_for cancels an operation at OP_TIMEOUT_S; the RPC it was in may then
        # surface as CANCELLED rather than as the timeout it is.
        late = time.perf_counter() - outcome.started >= OP_TIMEOUT_S - 0.05
        outcome.error = f"timed out after {OP_TIMEOUT_S:g} s" if late else _first_line(exc)
        tally.first_error = tally.first_error or outcome.error
    finally:
        outcome.ended = time.perf_counter()
        tally.in_flight -= 1


async def drive(operation: Operation, rate: float, total: int, t0: float, tally: Tally) -> None:
    """Starts operation k at t0 + k / rate (all that are due at once when late); then
    waits for every operation to end."""
    tasks: list[asyncio.Task[None]] = []
    k = 0
    while k < total:
        now = time.perf_counter()
        due = t0 + k / rate
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while k < total and t0 + k / rate <= now:
            outcome = Outcome(due=t0 + k / rate)
            tally.outcomes.append(outcome)
            tasks.append(asyncio.create_task(_one(operation, k, outcome, tally)))
            k += 1
    await asyncio.gather(*tasks)


async def run(
    address: str,
    service: str,
    op: str,
    rate: float,
    seconds: float,
    warmup_s: float,
    channels: int,
) -> dict[str, Any]:
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
            await asyncio.wait_for(channel.channel_ready(), timeout=OP_TIMEOUT_S)
        if op == "noop":
            per_channel = [noop_operation(channel, RPCS[service]) for channel in opened]
        elif service == "delivery":
            per_channel = [await delivery_operation(channel) for channel in opened]
        else:
            per_channel = [await session_operation(channel) for channel in opened]

        async def operation(k: int) -> None:
            await per_channel[k % channels](k)

        tally = Tally()
        total = round(rate * (warmup_s + seconds))
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter() + 0.05
        await drive(operation, rate, total, t0, tally)
        wall = time.perf_counter() - t0
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        for channel in opened:
            await channel.close()
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    window_from, window_to = t0 + warmup_s, t0 + warmup_s + seconds
    measured = [o for o in tally.outcomes if window_from <= o.due < window_to]
    latencies = [o.ended - o.due for o in measured if o.ok]
    finished_in_window = sum(
        1 for o in tally.outcomes if o.ok and window_from <= o.ended <= window_to
    )
    lags = sorted(o.started - o.due for o in measured)
    measurement = summarise(
        f"{service} {op}",
        0,
        seconds,
        latencies,
        finished_in_window,
        errors=sum(1 for o in measured if not o.ok),
        channels=channels,
    )
    measurement.rpcs_per_cycle = RPCS[service]
    measurement.extra = {
        "service": service,
        "op": op,
        "offered_rate": rate,
        "achieved_rate": round(finished_in_window / seconds, 1),
        "scheduled": len(measured),
        "completed": len(latencies),
        "start_lag_p50_ms": round(percentile(lags, 0.5) * 1000, 3),
        "start_lag_p99_ms": round(percentile(lags, 0.99) * 1000, 3),
        "max_in_flight": tally.max_in_flight,
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_wall_s": round(wall, 3),
        "loadgen_cpu_util": round(cpu / wall, 3) if wall > 0 else 0.0,
        "first_error": tally.first_error,
    }
    return measurement.to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of the service")
    parser.add_argument("--service", choices=tuple(RPCS), required=True)
    parser.add_argument(
        "--op",
        choices=("work", "noop"),
        default="work",
        help="work: a delivery cycle / an AppendEvents; noop: as many Health/Check calls",
    )
    parser.add_argument("--rate", type=float, required=True, help="operations started per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--channels", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.seconds <= 0 or args.warmup < 0 or args.channels < 1:
        parser.error("rate and seconds must be > 0, warmup >= 0, channels >= 1")
    result = asyncio.run(
        run(
            args.address,
            args.service,
            args.op,
            args.rate,
            args.seconds,
            args.warmup,
            args.channels,
        )
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
