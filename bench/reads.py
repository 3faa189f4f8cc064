"""The section `reads`: ListSessions and ResolveSession in statements and latency, against
the number of sessions and the length of their histories.

Logs seeded through the session core's write path (`bench.seeding`), on each selected
backend of SQLite FULL and Postgres, in two series: against sessions, 100 / 1,000
(/ 10,000) sessions of 10 messages; against history, 100 sessions of 10 / 100
(/ 1,000) messages. Then, in process on the core (no gRPC), the median of `REPEATS`
calls of a ListSessions page of `PAGE`, beside the same page built as it was before
summaries (each session folded from its snapshot and events: this run's baseline), and
of ResolveSession of an existing route. Statements are counted by the backend's
`StatementCounter` (transaction control and the Postgres clock sample left out).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import seeding, servers
from bench.plan import Context, Section
from bench.report import table
from session_service import records
from session_service.core import Core

PAGE = 100
REPEATS = 15


def _folded_page(core: Core) -> list[records.Session | None]:
    """The page as ListSessions built it before summaries: a fold per session."""
    rows = core.store.projections.list_sessions("bench", 0, "", None, PAGE)
    folded = [core.store.states.session_state(row.session_id) for row in rows]
    return [state.session for state in folded if state is not None]


async def _timed(core: Core, call: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    await call()  # warm
    with core.store.backend.statements.counting() as statements:
        await call()
    latencies = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        await call()
        latencies.append(time.perf_counter() - began)
    return {"statements": len(statements), "p50_ms": statistics.median(latencies) * 1000}


async def _figures(core: Core) -> dict[str, dict[str, float]]:
    rules = seeding.parts(core)
    reads, talk = rules.reads, rules.conversations
    source = records.Source(transport="web", conversation_id="tab-0")
    return {
        "list": await _timed(core, lambda: reads.list_sessions("bench", 0, "", PAGE, "")),
        "list_folded": await _timed(core, lambda: core.runner.read(lambda: _folded_page(core))),
        "resolve": await _timed(core, lambda: talk.resolve("bench", source, "")),
    }


def _message(i: int) -> Any:
    return seeding.message(f"message {i}")


def _point(url: str, sessions: int, messages: int) -> dict[str, Any]:
    with seeding.session_unit(url) as unit:
        ids = seeding.open_sessions(unit.core, "bench", sessions)
        seeding.seed_events(unit.core, ids, messages, _message, batch=100)
        return {"sessions": sessions, "messages": messages, **asyncio.run(_figures(unit.core))}


def run(ctx: Context) -> Section:
    sizes = ctx.scale.pick((100, 1000, 10_000), (100, 1000), (20,))
    lengths = ctx.scale.pick((10, 100, 1000), (10, 100), (5,))
    # The history series has the sessions of the sessions series' first point.
    points = sorted({(n, 10) for n in sizes} | {(sizes[0], m) for m in lengths})
    results = []
    for backend in (b for b in ctx.backends if b.key in ("sqlite-full", "postgres")):
        for sessions, messages in points:
            ctx.say(f"[reads] {backend.key}: {sessions:,} sessions x {messages:,} messages")
            with (
                servers.temp_dir("bench-reads-") as directory,
                servers.database(backend, directory) as url,
            ):
                results.append({"backend": backend.key, **_point(url, sessions, messages)})
    rows = [
        (
            r["backend"],
            f"{r['sessions']:,}",
            f"{r['messages']:,}",
            str(r["list"]["statements"]),
            f"{r['list']['p50_ms']:.2f}",
            str(r["list_folded"]["statements"]),
            f"{r['list_folded']['p50_ms']:.2f}",
            f"{r['list_folded']['p50_ms'] / r['list']['p50_ms']:.1f} x",
            str(r["resolve"]["statements"]),
            f"{r['resolve']['p50_ms']:.2f}",
        )
        for r in results
    ]
    header = (
        "backend",
        "sessions",
        "messages",
        "list stmts",
        "p50 ms",
        "folded stmts",
        "p50 ms",
        "folded / list",
        "resolve stmts",
        "p50 ms",
    )
    note = (
        f"list: a ListSessions page of {PAGE}; folded: the same page folded per session, as "
        f"before summaries; resolve: ResolveSession of an existing route; median of {REPEATS}"
    )
    title = "SessionService: ListSessions and ResolveSession in statements, in process"
    return Section("reads", title, table(header, rows, note), {"points": results})
