"""The section `timetravel`: restart and global rewind against the size of the log and
the number of its sessions (SQLite FULL).

Logs of message events are seeded through the session core's write path
(`bench.seeding`: sessions opened, then events by `Core.log`, as appends leave them)
in two series:
- against events: 10k / 100k (/ 1M in a full run) events over 1,000 sessions;
- against sessions: 100 / 1,000 (/ 10,000) sessions holding 10k (quick) or 100k
  events in all (the point both series share is seeded once).
On each log, **restart**: a real `switchboard serve session` process from spawn until it
listens (median of `RESTARTS`), as a ratio to the same on an empty log; **rewind**: one
global rewind to before every message (every session touched), in process, as a ratio
to the same rewind over as many sessions of one event each. Recovery is designed to
grow with sessions, not events: start-up checks the log head, and projections are
written in the same transactions as the events.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import seeding, servers
from bench.peers.goals import Side
from bench.plan import Context, Section
from bench.report import table

#: Server starts per restart measurement (the median is kept).
RESTARTS = 3
#: The log sizes the targets name (`bench.peers.goals.TARGETS`).
REWIND_TARGET = (100_000, 1000)
RESTART_TARGET = (1_000_000, 1000)
SIDES = ("rewind-100k", "restart-1m")


@dataclass(frozen=True)
class Plan:
    """Log sizes at `fixed_sessions` sessions, and session counts at `fixed_events`."""

    event_sizes: tuple[int, ...]
    session_counts: tuple[int, ...]
    fixed_events: int
    fixed_sessions: int = 1000

    def points(self) -> list[tuple[int, int]]:
        """(events, sessions) of every log to seed, each once, smallest first."""
        wanted = {(events, self.fixed_sessions) for events in self.event_sizes}
        wanted |= {(self.fixed_events, sessions) for sessions in self.session_counts}
        return sorted(wanted)

    def series(self, events: int, sessions: int) -> list[str]:
        found = []
        if sessions == self.fixed_sessions and events in self.event_sizes:
            found.append("events")
        if events == self.fixed_events and sessions in self.session_counts:
            found.append("sessions")
        return found


def plan(ctx: Context) -> Plan:
    return ctx.scale.pick(
        Plan((10_000, 100_000, 1_000_000), (100, 1000, 10_000), 100_000),
        Plan((10_000, 100_000), (100, 1000), 10_000),
        Plan((200, 400), (10, 20), 200, fixed_sessions=20),
    )


def seed(url: str, events: int, sessions: int) -> int:
    """`sessions` sessions holding `events` message events in all; the log's head after
    the sessions were opened (the rewind's target: before every message)."""
    with seeding.session_unit(url) as unit:
        ids = seeding.open_sessions(unit.core, "bench", sessions)
        mark = seeding.log_head(unit.core)
        seeding.seed_events(unit.core, ids, max(1, events // sessions), _message)
        return mark


def _message(i: int) -> Any:
    return seeding.message(f"message {i} " + "x" * 80)


def restart_seconds(url: str, directory: Path) -> float:
    """Median over RESTARTS starts of a real server, from spawn until it listens."""
    times = []
    for _ in range(RESTARTS):
        server = servers.ServerProcess(url, directory, service="session")
        began = time.perf_counter()
        server.start()
        times.append(time.perf_counter() - began)
        server.terminate()
    return statistics.median(times)


def rewind_seconds(url: str, target: int) -> float:
    """One global rewind to `target`, in process on the core."""
    with seeding.session_unit(url) as unit:
        travel = seeding.parts(unit.core).time_travel
        began = time.perf_counter()
        asyncio.run(travel.rewind(target, ""))
        return time.perf_counter() - began


def run(ctx: Context) -> Section:
    chosen = plan(ctx)
    rows: list[dict[str, Any]] = []
    with servers.temp_dir("bench-timetravel-") as base:
        empty = f"sqlite:///{base / 'empty.sqlite3'}"
        with seeding.session_unit(empty):
            pass  # opening it migrates it: an empty log
        empty_restart = restart_seconds(empty, base)
        baselines = {}
        for sessions in sorted({sessions for _, sessions in chosen.points()}):
            small = f"sqlite:///{base / f'one-event-{sessions}.sqlite3'}"
            baselines[sessions] = rewind_seconds(small, seed(small, sessions, sessions))
        for events, sessions in chosen.points():
            url = f"sqlite:///{base / f'log-{events}-{sessions}.sqlite3'}"
            began = time.perf_counter()
            mark = seed(url, events, sessions)
            seed_s = time.perf_counter() - began
            restart, rewind = restart_seconds(url, base), rewind_seconds(url, mark)
            rows.append(
                {
                    "events": events,
                    "sessions": sessions,
                    "series": chosen.series(events, sessions),
                    "seed_s": round(seed_s, 2),
                    "restart_s": round(restart, 3),
                    "restart_ratio": round(restart / empty_restart, 3),
                    "rewind_s": round(rewind, 3),
                    "rewind_baseline_s": round(baselines[sessions], 3),
                    "rewind_ratio": round(rewind / baselines[sessions], 3),
                }
            )
            ctx.say(
                f"[timetravel] {events:,} events / {sessions:,} sessions: restart {restart:.3f} s, "
                f"rewind {rewind:.3f} s (seeded in {seed_s:.1f} s)"
            )
            for leftover in base.glob(f"log-{events}-{sessions}.sqlite3*"):
                leftover.unlink()  # a 1M-event log is ~200 MB
    data = {"baseline_restart_s": round(empty_restart, 3), "rows": rows}
    title = "SessionService: restart and global rewind against events and sessions (SQLite FULL)"
    return Section("timetravel", title, _table(rows, empty_restart), data, _sides(rows, ctx))


def _table(rows: list[dict[str, Any]], empty_restart: float) -> str:
    header = (
        "series",
        "events",
        "sessions",
        "seed s",
        "restart s",
        "x empty",
        "rewind s",
        "baseline s",
        "x baseline",
    )
    cells = [
        (
            series,
            f"{r['events']:,}",
            f"{r['sessions']:,}",
            f"{r['seed_s']:.2f}",
            f"{r['restart_s']:.3f}",
            f"{r['restart_ratio']:.2f}",
            f"{r['rewind_s']:.3f}",
            f"{r['rewind_baseline_s']:.3f}",
            f"{r['rewind_ratio']:.2f}",
        )
        for series in ("events", "sessions")
        for r in rows
        if series in r["series"]
    ]
    note = (
        f"restart: median of {RESTARTS} starts until the server listens; x empty: over an empty "
        f"log's {empty_restart:.3f} s. rewind: one global rewind of every message, in process; "
        "baseline: the same rewind over as many sessions of one event each"
    )
    return table(header, cells, note)


def _sides(rows: list[dict[str, Any]], ctx: Context) -> dict[str, Side]:
    def at(point: tuple[int, int], field: str, name: str) -> Side:
        found = next((r for r in rows if (r["events"], r["sessions"]) == point), None)
        if found is None:
            return Side(name, missing=f"not measured ({ctx.scale.name} run)")
        return Side(name, found[field], "s")

    return {
        "rewind-100k": at(REWIND_TARGET, "rewind_s", "rewind of 100k events, 1,000 sessions"),
        "restart-1m": at(RESTART_TARGET, "restart_s", "restart at 1M events"),
    }
