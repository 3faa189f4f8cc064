"""Rewind and restart (recovery) time against the size of the log and its sessions.

    .venv/bin/python -m bench.timetravel [--quick]

Seeds SQLite (synchronous=FULL) logs of message events in two series:
- against events: 10k / 100k (/ 1M without --quick) events over 1,000 sessions;
- against sessions: 100 / 1,000 (/ 10,000) sessions holding 10k (quick) or
  100k events in all (the point both series share is seeded once),
then measures on each
- restart: a real `switchboard serve session` process, from spawn until it
  listens (median of `RESTARTS`), next to the same restart on an empty log;
- rewind: one global rewind over all of it (every session touched), in process,
  next to a rewind over a log of as many sessions with one event each.
Recovery is designed to grow with sessions, not events: start-up verifies the
log head in O(1) and projections are kept transactionally with the log.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from session_service import convert, records, storage_format
from session_service.agents import Agents
from session_service.conversations import Conversations, new_session_id
from session_service.core import Core, SessionLimits
from session_service.log_store import LogStore
from session_service.migrations import SESSION_SCHEMA
from session_service.time_travel import TimeTravel
from switchboard import migrations
from switchboard.database import DatabaseSettings, open_backend
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2 as pb

SESSIONS = 1000
#: Server starts per restart measurement (the median is kept).
RESTARTS = 3
RESULTS = Path(__file__).resolve().parent / "results" / "timetravel.json"


def seed(url: str, events: int, sessions: int = SESSIONS) -> int:
    """Opens `sessions` sessions through the real core, then bulk-loads message
    events into them (rows and projections exactly as appends would leave them).
    Returns the checkpoint sequence taken after the sessions were opened."""
    settings = DatabaseSettings(url=url)
    backend = open_backend(settings)
    migrations.prepare(backend, SESSION_SCHEMA)
    store = LogStore(backend)
    runner = TransactionRunner(backend, settings)
    core = Core(runner, store, SessionLimits())
    conversations = Conversations(core, Agents(core))
    try:

        def open_all(now: float) -> list[str]:
            agent = pb.Agent(name="bench")
            created = pb.Event(agent="bench", agent_created=pb.AgentCreated(agent=agent))
            core.log(now, [convert.event(created)])
            ids = []
            for n in range(sessions):
                source = pb.Source(transport="web", conversation_id=f"tab-{n}")
                session = conversations.open_session(
                    now,
                    "bench",
                    new_session_id(),
                    f"agent:bench:web:tab-{n}",
                    convert.to_record(records.Source, source),
                )
                ids.append(session.session_id)
            return ids

        ids = runner.submit_write(open_all).result()
        mark = runner.submit_write(lambda _now: store.head()).result()
        per_session = max(1, events // sessions)

        def load(now: float, first: int, count: int) -> None:
            rows = []
            for offset in range(count):
                seq = first + offset
                session_id = ids[(seq - mark - 1) % sessions]
                version = 2 + (seq - mark - 1) // sessions
                event = pb.Event(agent="bench", session_id=session_id, session_version=version)
                event.sequence = seq
                event.time.FromNanoseconds(int(now * 1e9))
                event.message_appended.message.role = pb.ROLE_USER
                event.message_appended.message.content = f"message {seq} " + "x" * 80
                payload = storage_format.encode_event(convert.event(event))
                fmt = storage_format.CURRENT
                rows.append((seq, "bench", session_id, "message_appended", fmt, payload, True))
            store.database.cursor().executemany(
                store._sql(
                    "INSERT INTO session_log "
                    "(seq, agent, session_id, kind, format, payload, active) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)"
                ),
                rows,
            )
            store.Head.update(seq=first + count - 1).execute()

        total = per_session * sessions
        for first in range(mark + 1, mark + 1 + total, 50_000):
            count = min(50_000, mark + 1 + total - first)
            runner.submit_write(functools.partial(_load_at, load, first, count)).result()

        def fix_index(_now: float) -> None:
            # Events went round robin over the sessions and `total` is a multiple of
            # `sessions`: the last round holds each session's last event, in order.
            last_round = store.head() - sessions + 1
            for index, session_id in enumerate(ids):
                store.Session.update(last_seq=last_round + index, version=1 + per_session).where(
                    store.Session.session_id == session_id
                ).execute()

        runner.submit_write(fix_index).result()
        return int(mark)
    finally:
        runner.close()


def _load_at(load: Any, first: int, count: int, now: float) -> None:
    load(now, first, count)


def restart_seconds(url: str, data_dir: Path, repeat: int = RESTARTS) -> float:
    """Median over `repeat` starts of a real server, from spawn until it listens."""
    return statistics.median(_restart_once(url, data_dir) for _ in range(repeat))


def _restart_once(url: str, data_dir: Path) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "switchboard_cli", "serve", "session", "--session-listen",
         "127.0.0.1:0", "--session-database-url", url, "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "listening on" in line:
                return time.perf_counter() - started
        raise RuntimeError("the server did not start")
    finally:
        process.terminate()
        process.wait(timeout=30)


def rewind_seconds(url: str, target: int) -> float:
    settings = DatabaseSettings(url=url)
    backend = open_backend(settings)
    store = LogStore(backend)
    runner = TransactionRunner(backend, settings)
    travel = TimeTravel(Core(runner, store, SessionLimits()))
    try:
        started = time.perf_counter()
        asyncio.run(travel.rewind(target, ""))
        return time.perf_counter() - started
    finally:
        runner.close()


# -- the plan and the measurement -------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Log sizes at SESSIONS sessions (against events), and session counts at a fixed
    number of events (against sessions)."""

    event_sizes: tuple[int, ...]
    session_counts: tuple[int, ...]
    fixed_events: int
    fixed_sessions: int = SESSIONS

    def points(self) -> list[tuple[int, int]]:
        """(events, sessions) of every log to seed, each once."""
        wanted = {(events, self.fixed_sessions) for events in self.event_sizes}
        wanted |= {(self.fixed_events, sessions) for sessions in self.session_counts}
        return sorted(wanted, key=lambda point: (point[0], point[1]))


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(event_sizes=(10_000, 100_000), session_counts=(100, 1000), fixed_events=10_000)
    return Plan(
        event_sizes=(10_000, 100_000, 1_000_000),
        session_counts=(100, 1000, 10_000),
        fixed_events=100_000,
    )


def measure(quick: bool, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Seeds each log of `plan(quick)` in a temporary directory, restarts a server on it
    and rewinds all of it; the baselines are measured first. `say` gets one line per log.
    """
    chosen = plan(quick)
    rows: list[dict[str, Any]] = []
    rewind_baselines: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-timetravel-") as tmp:
        base = Path(tmp)
        empty = f"sqlite:///{base / 'empty.sqlite3'}"
        migrations.prepare(open_backend(DatabaseSettings(url=empty)), SESSION_SCHEMA)
        baseline_restart = restart_seconds(empty, base)
        for sessions in sorted({sessions for _events, sessions in chosen.points()}):
            small = f"sqlite:///{base / f'one-event-{sessions}.sqlite3'}"
            rewind_baselines[sessions] = rewind_seconds(small, seed(small, sessions, sessions))
        for events, sessions in chosen.points():
            url = f"sqlite:///{base / f'log-{events}-{sessions}.sqlite3'}"
            seeded = time.perf_counter()
            mark = seed(url, events, sessions)
            seed_s = time.perf_counter() - seeded
            restart = restart_seconds(url, base)
            rewind = rewind_seconds(url, mark)
            series = [
                name
                for name, on in (
                    ("events", sessions == chosen.fixed_sessions and events in chosen.event_sizes),
                    (
                        "sessions",
                        events == chosen.fixed_events and sessions in chosen.session_counts,
                    ),
                )
                if on
            ]
            row = {
                "events": events,
                "sessions": sessions,
                "series": series,
                "seed_s": round(seed_s, 2),
                "restart_s": round(restart, 3),
                "restart_ratio": round(restart / baseline_restart, 3),
                "rewind_s": round(rewind, 3),
                "rewind_baseline_s": round(rewind_baselines[sessions], 3),
                "rewind_ratio": round(rewind / rewind_baselines[sessions], 3),
            }
            rows.append(row)
            say(_row_text(row))
            for leftover in base.glob(f"log-{events}-{sessions}.sqlite3*"):
                leftover.unlink()  # a 1M-event log is ~200 MB
    return {
        "plan": {
            "event_sizes": list(chosen.event_sizes),
            "session_counts": list(chosen.session_counts),
            "fixed_events": chosen.fixed_events,
            "fixed_sessions": chosen.fixed_sessions,
            "restarts_per_measurement": RESTARTS,
        },
        "baseline_restart_s": round(baseline_restart, 3),
        "baseline_rewind_s": {str(s): round(t, 3) for s, t in rewind_baselines.items()},
        "rows": rows,
        "targets": _targets(rows),
    }


def _row_text(row: dict[str, Any]) -> str:
    return (
        f"{row['events']:>9,} events / {row['sessions']:>6,} sessions: restart "
        f"{row['restart_s']:6.3f} s ({row['restart_ratio']:4.2f} x empty log), rewind of "
        f"everything {row['rewind_s']:6.3f} s ({row['rewind_ratio']:5.2f} x {row['sessions']:,} "
        "one-event sessions)"
    )


def _targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def find(events: int, sessions: int) -> dict[str, Any] | None:
        return next((r for r in rows if (r["events"], r["sessions"]) == (events, sessions)), None)

    rewind, restart = find(100_000, SESSIONS), find(1_000_000, SESSIONS)
    return [
        {
            "line": "rewind of 100k events in 1,000 sessions < 2 s",
            "measured_s": rewind["rewind_s"] if rewind else None,
            "met": rewind["rewind_s"] < 2.0 if rewind else None,
        },
        {
            "line": "1M-event restart < 10 s",
            "measured_s": restart["restart_s"] if restart else None,
            "met": restart["restart_s"] < 10.0 if restart else None,
        },
    ]


def render(result: dict[str, Any]) -> str:
    """Both series as tables, the baselines and the targets."""
    chosen = result["plan"]
    header = (
        f"{'events':>11}{'sessions':>10}{'seed s':>8}{'restart s':>11}{'x empty':>9}"
        f"{'rewind s':>10}{'baseline s':>12}{'x base':>8}"
    )
    lines: list[str] = []
    for series, title in (
        ("events", f"against events ({chosen['fixed_sessions']:,} sessions)"),
        ("sessions", f"against sessions ({chosen['fixed_events']:,} events)"),
    ):
        lines += [f"-- {title}", header, "-" * len(header)]
        for row in (r for r in result["rows"] if series in r["series"]):
            lines.append(
                f"{row['events']:>11,}{row['sessions']:>10,}{row['seed_s']:>8.2f}"
                f"{row['restart_s']:>11.3f}{row['restart_ratio']:>9.2f}{row['rewind_s']:>10.3f}"
                f"{row['rewind_baseline_s']:>12.3f}{row['rewind_ratio']:>8.2f}"
            )
    baselines = ", ".join(
        f"{int(s):,} sessions {t:.3f} s" for s, t in result["baseline_rewind_s"].items()
    )
    lines.append(
        f"(restart: median of {chosen['restarts_per_measurement']} starts of `switchboard serve "
        f"session` until it listens; x empty: over the same on an empty log, "
        f"{result['baseline_restart_s']:.3f} s. rewind: one global rewind of everything, in "
        "process; baseline: the same rewind over as many sessions of one event each "
        f"({baselines}); x base: rewind s / baseline s)"
    )
    for target in result["targets"]:
        verdict = (
            "not measured"
            if target["met"] is None
            else f"{'MET' if target['met'] else 'NOT MET'} ({target['measured_s']:.3f} s)"
        )
        lines.append(f"target: {target['line']}: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="10k and 100k events; 100 and 1,000 sessions at 10k"
    )
    args = parser.parse_args(argv)
    result = measure(args.quick, say=lambda line: print(line, file=sys.stderr, flush=True))
    print(render(result))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
