"""Read latency against the number of past rewinds (issue 13, item 1).

    .venv/bin/python -m bench.rewinds [--quick] [--only sqlite|postgres]

For each backend and each count of past rewinds (0, 100, 1,000, 10,000; --quick
stops at 1,000), a fresh database gets one session with the same active log:
MESSAGES kept messages (each with the temp state it leaves). Of those, `rewinds`
are written in rounds "append a kept and an abandoned half, rewind to the kept
half" (the core's own rules, ROUNDS_PER_COMMIT rounds per write transaction)
and the rest as plain appends, so the logs differ only in their past rewinds
(and the abandoned rows and RewindApplied records those leave). Then a real
`switchboard serve session` process serves it and GetSessionState and
GetHistory (newest 100) are timed, one client, CALLS calls each after a
warm-up, ROUNDS turns round robin over all the logs of a backend (served at
once); p50 and p99 are printed with the ratio to the no-rewind log of the
same run. Results: bench/results/rewinds.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench.servers import (
    postgres_schema,
    postgres_unreachable_reason,
    running_server,
    temp_dir,
)
from session_service import convert, records, routing
from session_service.agents import Agents
from session_service.app import SessionUnit
from session_service.conversations import Conversations, new_session_id
from session_service.time_travel import TimeTravel
from switchboard.database import DatabaseSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

MESSAGES = 10_000
REWIND_COUNTS = (0, 100, 1_000, 10_000)
QUICK_COUNTS = (0, 100, 1_000)
ROUNDS_PER_COMMIT = 250
CALLS = 200
#: Round-robin turns over the served logs.
ROUNDS = 3
WARM_UP = 30
PAGE = 100
RESULTS = Path(__file__).resolve().parent / "results" / "rewinds.json"


def _message(text: str) -> pb.Event:
    event = pb.Event()
    event.message_appended.message.role = pb.ROLE_USER
    event.message_appended.message.content = text
    return event


def _temp(value: str) -> pb.Event:
    event = pb.Event()
    event.temp_state_changed.set["last"] = value
    return event


def seed(url: str, rewinds: int, say: Callable[[str], None]) -> str:
    """The session's log as the module docstring describes; returns its id."""
    unit = SessionUnit(DatabaseSettings(url=url))
    try:
        return _seed(unit, rewinds, say)
    finally:
        unit.runner.close()


def _seed(unit: SessionUnit, rewinds: int, say: Callable[[str], None]) -> str:
    sessions, store = unit.core, unit.store
    travel = TimeTravel(sessions)
    conversations = Conversations(sessions, Agents(sessions))

    def open_one(now: float) -> str:
        sessions.log(now, [convert.event(pb.Event(agent="bench", agent_created=pb.AgentCreated(
            agent=pb.Agent(name="bench"))))])  # fmt: skip
        source = records.Source(transport="web", conversation_id="tab")
        key = routing.routing_key("bench", source, None)
        opened = conversations.open_session(now, "bench", new_session_id(), key, source)
        return str(opened.session_id)

    session_id: str = unit.runner.submit_write(open_one).result()

    def logged(now: float, bodies: list[pb.Event]) -> list[records.Event]:
        index = store.session_index(session_id)
        assert index is not None
        for offset, event in enumerate(bodies):
            event.agent, event.session_id = "bench", session_id
            event.session_version = index.version + offset + 1
        return sessions.log(now, [convert.event(body) for body in bodies], index)

    def plain(first: int, count: int, now: float) -> None:
        for i in range(first, first + count):
            logged(now, [_message(f"k{i}"), _temp(f"k{i}")])

    def rounds(first: int, count: int, now: float) -> None:
        for i in range(first, first + count):
            events = logged(now, [_message(f"k{i}"), _temp(f"k{i}"), _message(f"d{i}"),
                                  _temp(f"d{i}")])  # fmt: skip
            moved = travel.rewind_within(now, events[1].sequence)
            assert moved.abandoned == 2, moved

    started = time.perf_counter()
    for first in range(0, MESSAGES - rewinds, ROUNDS_PER_COMMIT):
        count = min(ROUNDS_PER_COMMIT, MESSAGES - rewinds - first)
        unit.runner.submit_write(functools.partial(plain, first, count)).result()
    for first in range(MESSAGES - rewinds, MESSAGES, ROUNDS_PER_COMMIT):
        count = min(ROUNDS_PER_COMMIT, MESSAGES - first)
        unit.runner.submit_write(functools.partial(rounds, first, count)).result()
    if unit.store.backend.name == "postgres":
        # What autovacuum would do soon anyway: the planner's statistics of the new rows.
        unit.runner.submit_write(lambda _now: store.database.execute_sql("ANALYZE")).result()
    say(f"  seeded {rewinds} rewinds in {time.perf_counter() - started:.1f} s")
    return session_id


def _timed(call: Callable[[], Any]) -> list[float]:
    for _ in range(WARM_UP):
        call()
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": statistics.median(ordered),
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
    }


def read_samples(address: str, session_id: str) -> dict[str, list[float]]:
    """Checks the reads' answers, then times CALLS of each (milliseconds)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        state_request = pb.GetSessionStateRequest(agent="bench", session_id=session_id)
        history_request = pb.GetHistoryRequest(
            agent="bench", session_id=session_id, limit=PAGE, newest=True
        )
        state = stub.GetSessionState(state_request).state
        assert state.temp_state["last"] == f"k{MESSAGES - 1}", state.temp_state
        page = stub.GetHistory(history_request).messages
        assert [m.message.content for m in page] == [
            f"k{i}" for i in range(MESSAGES - PAGE, MESSAGES)
        ]
        return {
            "GetSessionState": _timed(lambda: stub.GetSessionState(state_request)),
            "GetHistory": _timed(lambda: stub.GetHistory(history_request)),
        }


@contextmanager
def _database(backend: str, base: Path, rewinds: int) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{base / f'rewinds-{rewinds}.sqlite3'}"
    else:
        with postgres_schema() as url:
            yield url


def measure(
    backends: list[str], counts: tuple[int, ...], say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Per backend, every log is seeded and served at once, then measured in turns
    (ROUNDS times round robin), so a drift in the machine's speed hits all alike."""
    rows: list[dict[str, Any]] = []
    for backend in backends:
        with ExitStack() as stack:
            served = []
            for rewinds in counts:
                say(f"{backend}: {rewinds} past rewinds")
                base = stack.enter_context(temp_dir("bench-rewinds-"))
                url = stack.enter_context(_database(backend, base, rewinds))
                session_id = seed(url, rewinds, say)
                server = stack.enter_context(running_server(url, base, service="session"))
                served.append((rewinds, server.address, session_id))
            samples: dict[int, dict[str, list[float]]] = {
                rewinds: {"GetSessionState": [], "GetHistory": []} for rewinds in counts
            }
            for turn in range(ROUNDS):
                say(f"{backend}: measuring, turn {turn + 1} of {ROUNDS}")
                for rewinds, address, session_id in served:
                    for rpc, taken in read_samples(address, session_id).items():
                        samples[rewinds][rpc] += taken
        for rewinds in counts:
            latency = {rpc: _summary(taken) for rpc, taken in samples[rewinds].items()}
            rows.append({"backend": backend, "rewinds": rewinds, **latency})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'backend':9} {'rewinds':>8} | {'GetSessionState p50':>20} {'p99':>7} {'ratio':>6} |"
        f" {'GetHistory p50':>15} {'p99':>7} {'ratio':>6}"
    ]
    baselines = {row["backend"]: row for row in rows if row["rewinds"] == 0}
    for row in rows:
        base = baselines[row["backend"]]
        cells = []
        for rpc in ("GetSessionState", "GetHistory"):
            p50, p99 = row[rpc]["p50_ms"], row[rpc]["p99_ms"]
            ratio = p50 / base[rpc]["p50_ms"]
            cells.append(f"{p50:>17.2f} ms {p99:>7.2f} {ratio:>5.2f}x")
        lines.append(f"{row['backend']:9} {row['rewinds']:>8} | {cells[0]} | {cells[1]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="up to 1,000 rewinds")
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    args = parser.parse_args(argv)
    backends = [args.only] if args.only else ["sqlite", "postgres"]
    if "postgres" in backends and (reason := postgres_unreachable_reason()):
        print(f"skipping Postgres: {reason}", file=sys.stderr)
        backends.remove("postgres")
    counts = QUICK_COUNTS if args.quick else REWIND_COUNTS
    rows = measure(backends, counts, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(rows))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"messages": MESSAGES, "page": PAGE, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
