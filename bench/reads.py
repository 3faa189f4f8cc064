"""ListSessions and ResolveSession: statements and latency against sessions and history.

    .venv/bin/python -m bench.reads [--quick]

Seeds logs through the real core (`Core.log`, so projections, summaries and
snapshots are exactly what appends leave) on SQLite (synchronous=FULL) and, when it
answers, Postgres (a fresh schema), in two series:
- against sessions: 100 / 1,000 (/ 10,000 without --quick) sessions of 10 messages;
- against history: 100 sessions of 10 / 100 (/ 1,000) messages;
then measures, in process on the core (no gRPC), the median of `REPEATS` calls of
- ListSessions, one page of 100, and beside it, as the same run's baseline, the same
  page built the way it was before summaries (each session folded from its snapshot
  and events);
- ResolveSession of an existing route.
Statements are counted by the backend's `StatementCounter` (transaction control and
the Postgres clock sample left out; the write transaction's log lock counted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.servers import postgres_schema, postgres_unreachable_reason
from session_service import convert, records, routing
from session_service.agents import Agents
from session_service.conversations import Conversations, new_session_id
from session_service.core import Core, SessionLimits
from session_service.log_store import LogStore
from session_service.migrations import SESSION_SCHEMA
from session_service.session_reads import SessionReads
from switchboard import migrations
from switchboard.database import DatabaseSettings, open_backend
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2 as pb

PAGE = 100
REPEATS = 15
RESULTS = Path(__file__).resolve().parent / "results" / "reads.json"


@contextmanager
def core(url: str) -> Iterator[Core]:
    settings = DatabaseSettings(url=url)
    backend = open_backend(settings)
    migrations.prepare(backend, SESSION_SCHEMA)
    runner = TransactionRunner(backend, settings, begin_write=LogStore(backend).lock_log)
    try:
        yield Core(runner, LogStore(backend), SessionLimits())
    finally:
        runner.close()


def seed(sessions: Core, count: int, messages: int) -> None:
    conversations = Conversations(sessions, Agents(sessions))

    def open_all(now: float) -> None:
        agent = pb.Agent(name="bench")
        created = pb.Event(agent="bench", agent_created=pb.AgentCreated(agent=agent))
        sessions.log(now, [convert.event(created)])
        for n in range(count):
            source = convert.to_record(
                records.Source, pb.Source(transport="web", conversation_id=f"tab-{n}")
            )
            key = routing.routing_key("bench", source, None)
            session_id = conversations.open_session(now, "bench", new_session_id(), key, source)
            index = sessions.store.session_index(session_id.session_id)
            assert index is not None
            events = [
                convert.event(
                    pb.Event(
                        agent="bench",
                        session_id=index.session_id,
                        session_version=index.version + 1 + i,
                        message_appended=pb.MessageAppended(
                            message=pb.Message(role=pb.ROLE_USER, content=f"message {i}")
                        ),
                    )
                )
                for i in range(messages)
            ]
            for start in range(0, len(events), 100):
                sessions.log(now, events[start : start + 100])

    sessions.runner.submit_write(open_all).result()


def folded_page(sessions: Core) -> list[records.Session | None]:
    """The page as ListSessions built it before summaries: a fold per session."""
    rows = sessions.store.list_sessions("bench", 0, "", None, PAGE)
    folded = [sessions.store.session_state(row.session_id) for row in rows]
    return [state.session for state in folded if state is not None]


async def measure(sessions: Core, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    counter = sessions.store.backend.statements
    await call()  # warm
    with counter.counting() as statements:
        await call()
    latencies = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - started)
    return {"statements": len(statements), "p50_ms": statistics.median(latencies) * 1000}


async def figures(sessions: Core) -> dict[str, Any]:
    source = records.Source(transport="web", conversation_id="tab-0")
    conversations = Conversations(sessions, Agents(sessions))
    reads = SessionReads(sessions)
    return {
        "list": await measure(sessions, lambda: reads.list_sessions("bench", 0, "", PAGE, "")),
        "list_folded": await measure(
            sessions, lambda: sessions.runner.read(lambda: folded_page(sessions))
        ),
        "resolve": await measure(sessions, lambda: conversations.resolve("bench", source, "")),
    }


def point(url: str, count: int, messages: int) -> dict[str, Any]:
    with core(url) as sessions:
        seed(sessions, count, messages)
        measured = asyncio.run(figures(sessions))
    return {"sessions": count, "messages": messages, **measured}


@contextmanager
def database(name: str) -> Iterator[str]:
    if name == "postgres":
        with postgres_schema() as url:
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="bench-reads-") as directory:
        yield f"sqlite:///{directory}/session.sqlite3"


def run(quick: bool) -> list[dict[str, Any]]:
    sizes = [100, 1000] if quick else [100, 1000, 10_000]
    lengths = [10, 100] if quick else [10, 100, 1000]
    points = sorted({(n, 10) for n in sizes} | {(100, m) for m in lengths})
    backends = ["sqlite"]
    reason = postgres_unreachable_reason()
    if reason is None:
        backends.append("postgres")
    else:
        print(f"postgres skipped: {reason}", file=sys.stderr)
    results = []
    for backend in backends:
        for count, messages in points:
            print(f"{backend}: {count} sessions x {messages} messages", file=sys.stderr)
            with database(backend) as url:
                results.append({"backend": backend, **point(url, count, messages)})
    return results


def report(results: list[dict[str, Any]]) -> None:
    header = (
        f"{'backend':9} {'sessions':>8} {'msgs':>5} | {'list stmts':>10} {'p50 ms':>7} | "
        f"{'folded stmts':>12} {'p50 ms':>7} {'ratio':>6} | {'resolve stmts':>13} {'p50 ms':>7}"
    )
    print(header)
    for r in results:
        lst, folded, res = r["list"], r["list_folded"], r["resolve"]
        print(
            f"{r['backend']:9} {r['sessions']:>8} {r['messages']:>5} | "
            f"{lst['statements']:>10} {lst['p50_ms']:>7.2f} | "
            f"{folded['statements']:>12} {folded['p50_ms']:>7.2f} "
            f"{folded['p50_ms'] / lst['p50_ms']:>6.1f} | "
            f"{res['statements']:>13} {res['p50_ms']:>7.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller series")
    args = parser.parse_args()
    results = run(args.quick)
    report(results)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
