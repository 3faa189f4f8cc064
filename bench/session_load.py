"""The SessionService load generator: appends and next-turn loads over gRPC (grpc.aio).

Run as its own process (the runner does this), never inside the server's:

    python -m bench.session_load --address 127.0.0.1:PORT --mode append --clients 8
    python -m bench.session_load --address 127.0.0.1:PORT --mode turn --events 1000

`--mode append`: one agent is created (CreateAgent, once), then every client
coroutine resolves its own session (ResolveSession, transport "web",
conversation "tab-N") and repeats AppendEvents with one MessageAppended event
(a USER message of `MESSAGE_BYTES` bytes), each call awaited before the next.
Setup happens before the clock starts; then the first `--warmup` seconds are
not counted; a call counts when it ends inside the window, its latency when it
also started inside it (as in `bench.delivery_cycle`).

`--mode turn`: what a gateway does before every model turn. One session is
seeded with `--events` message events (AppendEvents, `SEED_BATCH` events per
call, alternating USER / ASSISTANT), then one client runs `--repetitions` times
GetSessionState + GetHistory(limit=50, newest=true), sequentially; the pair's
latency is one sample (`--warmup-reps` pairs first, not counted).

`--mode noop`: one `grpc.health.v1.Health/Check` per operation, timed like the
appends: the ceiling of the gRPC layer alone on this machine.

Prints one JSON object (a `bench.stats.Measurement`) on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.request_ids import request_id
from bench.stats import percentile, summarise
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

#: Per-RPC deadline: a stuck call ends the client, never the whole run.
RPC_TIMEOUT_S = 10.0
#: Size of every benchmark message's content, in bytes (ASCII).
MESSAGE_BYTES = 100
#: Events per AppendEvents call when seeding (the server's maximum).
SEED_BATCH = 100
#: Messages a gateway loads for its next turn.
HISTORY_LIMIT = 50
#: Upper bound for `--events` (keeps seeding bounded).
MAX_EVENTS = 100_000


def message_content(client: int, i: int) -> str:
    """A message of exactly MESSAGE_BYTES ASCII bytes, unique per (client, i)."""
    head = f"bench user message {i} from tab-{client}: "
    filler = "the quick brown fox jumps over the lazy dog. " * 3
    return (head + filler)[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, ".")


def message_event(
    client: int, i: int, role: pb.Role.ValueType = pb.ROLE_USER
) -> pb.SessionEventInput:
    message = pb.Message(role=role, content=message_content(client, i))
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


async def create_agent(stub: pb_grpc.SessionServiceAsyncStub, name: str) -> None:
    await stub.CreateAgent(
        pb.CreateAgentRequest(agent=pb.Agent(name=name, display_name="bench agent")),
        timeout=RPC_TIMEOUT_S,
    )


async def resolve_session(stub: pb_grpc.SessionServiceAsyncStub, agent: str, tab: str) -> str:
    resolved = await stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent=agent, source=pb.Source(transport="web", conversation_id=tab)
        ),
        timeout=RPC_TIMEOUT_S,
    )
    if not resolved.created:
        raise RuntimeError(f"session for {tab} existed already: agent names not unique")
    return resolved.session.session_id


# -- appends ----------------------------------------------------------------------------------


async def append_message(
    stub: pb_grpc.SessionServiceAsyncStub, agent: str, session_id: str, client: int, i: int
) -> None:
    """The `i`-th append (from 0) of `client`'s session: one AppendEvents of one
    MessageAppended event, checked to have made the session's version i + 2."""
    response = await stub.AppendEvents(
        pb.AppendEventsRequest(
            agent=agent,
            session_id=session_id,
            events=[message_event(client, i)],
            request_id=request_id(),
        ),
        timeout=RPC_TIMEOUT_S,
    )
    # Version 1 is the SessionOpened event; every append adds one.
    if response.version != i + 2 or len(response.events) != 1:
        raise RuntimeError(
            f"append {i + 1} of {session_id} answered version {response.version}, expected {i + 2}"
        )


async def _append_client(
    stub: pb_grpc.SessionServiceAsyncStub,
    agent: str,
    session_id: str,
    client: int,
    measure_from: float,
    stop_at: float,
) -> ClientResult:
    result = ClientResult()
    i = 0
    try:
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                break
            await append_message(stub, agent, session_id, client, i)
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
        result.first_error = _first_line(exc)
    return result


async def _noop_client(
    channel: grpc.aio.Channel, measure_from: float, stop_at: float
) -> ClientResult:
    """One Health/Check per operation, timed like an append."""
    result = ClientResult()
    check = health_pb2_grpc.HealthStub(channel).Check
    request = health_pb2.HealthCheckRequest(service="")
    try:
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                break
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
        result.first_error = _first_line(exc)
    return result


async def run_appends(
    opened: list[grpc.aio.Channel], mode: str, clients: int, seconds: float, warmup_s: float
) -> dict[str, Any]:
    stubs = [pb_grpc.SessionServiceStub(channel) for channel in opened]
    channels = len(opened)
    agent = f"bench-{uuid.uuid4().hex[:12]}"  # unique on a database that outlives one run
    session_ids: list[str] = []
    if mode == "append":
        await create_agent(stubs[0], agent)
        for n in range(clients):
            session_ids.append(await resolve_session(stubs[n % channels], agent, f"tab-{n}"))
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    wall_before = time.perf_counter()
    measure_from = wall_before + warmup_s
    stop_at = measure_from + seconds
    if mode == "noop":
        coroutines = [
            _noop_client(opened[n % channels], measure_from, stop_at) for n in range(clients)
        ]
    else:
        coroutines = [
            _append_client(stubs[n % channels], agent, session_ids[n], n, measure_from, stop_at)
            for n in range(clients)
        ]
    results = await asyncio.wait_for(
        asyncio.gather(*coroutines), timeout=warmup_s + seconds + 4 * RPC_TIMEOUT_S
    )
    wall = time.perf_counter() - wall_before
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    measurement = summarise(
        mode,
        clients,
        seconds,
        [latency for result in results for latency in result.latencies],
        sum(result.completed for result in results),
        errors=sum(result.errors for result in results),
        channels=channels,
    )
    measurement.rpcs_per_cycle = 1
    measurement.extra = {
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_wall_s": round(wall, 3),
        "loadgen_cpu_util": round(cpu / wall, 3) if wall > 0 else 0.0,
        "first_error": next((r.first_error for r in results if r.first_error), ""),
        "message_bytes": MESSAGE_BYTES,
    }
    return measurement.to_json()


# -- next-turn loads --------------------------------------------------------------------------


async def _seed(
    stub: pb_grpc.SessionServiceAsyncStub, agent: str, session_id: str, events: int
) -> float:
    """Appends `events` message events in calls of SEED_BATCH; returns the seconds it took."""
    began = time.perf_counter()
    version = 1
    for start in range(0, events, SEED_BATCH):
        batch = [
            message_event(0, i, pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT)
            for i in range(start, min(start + SEED_BATCH, events))
        ]
        response = await stub.AppendEvents(
            pb.AppendEventsRequest(
                agent=agent, session_id=session_id, expected_version=version, events=batch
            ),
            timeout=RPC_TIMEOUT_S * 3,
        )
        version += len(batch)
        if response.version != version:
            raise RuntimeError(f"seeding: version {response.version}, expected {version}")
    return time.perf_counter() - began


async def run_turns(
    channel: grpc.aio.Channel, events: int, repetitions: int, warmup_reps: int
) -> dict[str, Any]:
    stub = pb_grpc.SessionServiceStub(channel)
    agent = f"bench-{uuid.uuid4().hex[:12]}"
    await create_agent(stub, agent)
    session_id = await resolve_session(stub, agent, "tab-turn")
    seed_s = await _seed(stub, agent, session_id, events)
    expected_history = min(events, HISTORY_LIMIT)
    state_request = pb.GetSessionStateRequest(agent=agent, session_id=session_id)
    history_request = pb.GetHistoryRequest(
        agent=agent, session_id=session_id, limit=HISTORY_LIMIT, newest=True
    )
    totals: list[float] = []
    states: list[float] = []
    histories: list[float] = []
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    wall_before = time.perf_counter()
    for rep in range(warmup_reps + repetitions):
        began = time.perf_counter()
        state = await stub.GetSessionState(state_request, timeout=RPC_TIMEOUT_S)
        between = time.perf_counter()
        history = await stub.GetHistory(history_request, timeout=RPC_TIMEOUT_S)
        ended = time.perf_counter()
        if state.state.session.message_count != events:
            raise RuntimeError(
                f"session holds {state.state.session.message_count} messages, expected {events}"
            )
        if len(history.messages) != expected_history:
            raise RuntimeError(
                f"history returned {len(history.messages)} messages, expected {expected_history}"
            )
        if rep == warmup_reps:  # the measured part starts here
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
            wall_before = began
        if rep >= warmup_reps:
            totals.append(ended - began)
            states.append(between - began)
            histories.append(ended - between)
    wall = time.perf_counter() - wall_before
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    measurement = summarise("turn", 1, wall, totals, len(totals), channels=1)
    measurement.rpcs_per_cycle = 2
    states.sort()
    histories.sort()
    measurement.extra = {
        "events": events,
        "history_limit": HISTORY_LIMIT,
        "seed_s": round(seed_s, 3),
        "seed_calls": -(-events // SEED_BATCH),
        "state_p50_ms": round(percentile(states, 0.5) * 1000, 3),
        "state_p99_ms": round(percentile(states, 0.99) * 1000, 3),
        "history_p50_ms": round(percentile(histories, 0.5) * 1000, 3),
        "history_p99_ms": round(percentile(histories, 0.99) * 1000, 3),
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_wall_s": round(wall, 3),
        "loadgen_cpu_util": round(cpu / wall, 3) if wall > 0 else 0.0,
        "message_bytes": MESSAGE_BYTES,
    }
    return measurement.to_json()


# -- entry point ------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    opened = [
        grpc.aio.insecure_channel(
            _only_127(args.address),
            # A local subchannel pool gives every channel its own connection.
            options=[("grpc.use_local_subchannel_pool", 1)],
        )
        for _ in range(args.channels)
    ]
    try:
        for channel in opened:
            await asyncio.wait_for(channel.channel_ready(), timeout=RPC_TIMEOUT_S)
        if args.mode == "turn":
            return await run_turns(opened[0], args.events, args.repetitions, args.warmup_reps)
        return await run_appends(opened, args.mode, args.clients, args.seconds, args.warmup)
    finally:
        for channel in opened:
            await channel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of a SessionService")
    parser.add_argument("--mode", choices=("append", "noop", "turn"), default="append")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--events", type=int, default=1000, help="turn: events to seed")
    parser.add_argument("--repetitions", type=int, default=300, help="turn: measured loads")
    parser.add_argument("--warmup-reps", type=int, default=20, help="turn: loads not counted")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.channels < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("clients and channels must be >= 1, seconds > 0, warmup >= 0")
    if not 1 <= args.events <= MAX_EVENTS or args.repetitions < 1 or args.warmup_reps < 0:
        parser.error(f"events must be 1..{MAX_EVENTS}, repetitions >= 1, warmup-reps >= 0")
    args.channels = 1 if args.mode == "turn" else min(args.channels, args.clients)
    result = asyncio.run(run(args))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
