"""The in-process peers `python -m bench` measures beside Switchboard, when the `bench`
extra is installed (`pip install -e '.[bench]'`); otherwise each is a "skipped" line.

- `adk`: Google ADK `DatabaseSessionService` and `SqliteSessionService` on SQLite,
  `append_event` at 1 client and `get_session` of a 1,000-event session;
- `langgraph_saver`: LangGraph `SqliteSaver.put` with growing chat state;
- `openai_agents`: OpenAI Agents `SQLiteSession.add_items`, 1 and 8 clients;
- `procrastinate_jobs`: procrastinate's job cycle on Postgres in a fresh schema.

Each peer runs in its own process (`bench.peers.child`); `measure_all` starts them
one after the other and turns a missing extra, an unreachable Postgres or a
failed run into `PeerResult`s that say "skipped (...)". `bench.peers.goals` holds
the goal lines the runner prints from these figures and Switchboard's.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import servers
from bench.peers.common import SKIPPED_NO_EXTRA, PeerResult

__all__ = ["PEERS", "Peer", "PeerResult", "measure_all", "render_table"]


@dataclass(frozen=True)
class Peer:
    """One peer process: the modules the extra brings for it and the figures it yields."""

    name: str
    modules: tuple[str, ...]
    figures: tuple[tuple[str, str, str], ...]  # (key, label, kind) of each PeerResult
    postgres: bool = False
    runs: int = 1  # timed windows it runs, for its timeout


PEERS = (
    Peer(
        "adk-database",
        ("google.adk", "sqlalchemy", "aiosqlite"),
        (
            ("adk-database-append", "ADK DatabaseSessionService.append_event", "rate"),
            (
                "adk-database-get-session",
                "ADK DatabaseSessionService.get_session @1,000",
                "latency",
            ),
        ),
    ),
    Peer(
        "adk-sqlite",
        ("google.adk", "aiosqlite"),
        (
            ("adk-sqlite-append", "ADK SqliteSessionService.append_event", "rate"),
            ("adk-sqlite-get-session", "ADK SqliteSessionService.get_session @1,000", "latency"),
        ),
    ),
    Peer(
        "langgraph",
        ("langgraph.checkpoint.sqlite", "langchain_core"),
        (("langgraph-put", "LangGraph SqliteSaver.put, growing state", "rate"),),
    ),
    Peer(
        "openai-agents",
        ("agents",),
        (
            (
                "openai-agents-add-items-1",
                "OpenAI Agents SQLiteSession.add_items, 1 client",
                "rate",
            ),
            (
                "openai-agents-add-items-8",
                "OpenAI Agents SQLiteSession.add_items, 8 clients",
                "rate",
            ),
        ),
        runs=2,
    ),
    Peer(
        "procrastinate",
        ("procrastinate", "psycopg"),
        (("procrastinate-job-cycle", "procrastinate job cycle (defer + fetch + finish)", "rate"),),
        postgres=True,
        runs=2,
    ),
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a missing parent package raises
        return False


def skipped(peer: Peer, reason: str) -> list[PeerResult]:
    return [PeerResult(key, label, kind, skipped=reason) for key, label, kind in peer.figures]


def missing_reason(peer: Peer, postgres_reason: str | None) -> str | None:
    """Why `peer` cannot run here, or None when it can."""
    if not all(_installed(module) for module in peer.modules):
        return SKIPPED_NO_EXTRA
    if peer.postgres and postgres_reason is not None:
        return f"skipped (postgres: {postgres_reason})"
    return None


def run_child(peer: Peer, seconds: float, warmup_s: float, repetitions: int) -> list[PeerResult]:
    """`bench.peers.child` for one peer; a failure becomes skipped lines with its last words."""
    command = [
        sys.executable,
        "-m",
        "bench.peers.child",
        peer.name,
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup_s),
        "--repetitions",
        str(repetitions),
    ]
    timeout_s = peer.runs * (seconds + warmup_s) + 180
    try:
        done = subprocess.run(
            command,
            cwd=servers.REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return skipped(peer, f"skipped (no answer in {timeout_s:.0f} s)")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return skipped(peer, f"skipped (failed, exit {done.returncode}: {last[:200]})")
    return [PeerResult.from_json(item) for item in json.loads(done.stdout)]


def measure_all(
    seconds: float,
    warmup_s: float,
    repetitions: int,
    postgres_reason: str | None,
    say: Callable[[str], None],
    peers: Sequence[Peer] = PEERS,
) -> list[PeerResult]:
    """Every peer, one process after the other; skipped ones cost nothing."""
    results: list[PeerResult] = []
    for peer in peers:
        reason = missing_reason(peer, postgres_reason)
        found = skipped(peer, reason) if reason else run_child(peer, seconds, warmup_s, repetitions)
        for result in found:
            say(f"[peers] {describe(result)}")
        results.extend(found)
    return results


def describe(result: PeerResult) -> str:
    m = result.measurement
    if m is None:
        return f"{result.label}: {result.skipped}"
    if result.kind == "latency":
        return f"{result.label}: p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms ({result.settings})"
    return (
        f"{result.label}: {m.cycles_per_s:,.0f} /s, p50 {m.p50_ms:.2f} ms, "
        f"p99 {m.p99_ms:.2f} ms ({result.settings})"
    )


_HEADER = f"{'peer (in-process)':<62}{'clients':>8}{'ops/s':>11}{'p50 ms':>9}{'p99 ms':>9}  storage"


def render_table(results: Sequence[PeerResult]) -> str:
    lines = [_HEADER, "-" * len(_HEADER)]
    for result in results:
        m = result.measurement
        if m is None:
            lines.append(f"{result.label:<62}{'':>8}  {result.skipped}")
            continue
        rate = "-" if result.kind == "latency" else f"{m.cycles_per_s:,.1f}"
        lines.append(
            f"{result.label:<62}{m.clients:>8}{rate:>11}{m.p50_ms:>9.2f}{m.p99_ms:>9.2f}"
            f"  {result.settings}"
        )
    lines.append(
        "(ops/s: durable writes of one ~100-byte user message each (job cycles for "
        "procrastinate); get_session rows: latency of one load, no rate)"
    )
    return "\n".join(lines)
