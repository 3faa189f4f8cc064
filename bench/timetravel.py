"""Rewind and restart (recovery) time against the size of the log.

    .venv/bin/python -m bench.timetravel [--quick]

Seeds SQLite (synchronous=FULL) logs of 10k / 100k (/ 1M without --quick)
message events spread over 1,000 sessions, then measures
- restart: a real `switchboard serve session` process, from spawn until it
  listens, next to the same restart on an empty log (the baseline);
- rewind: one global rewind over all of it (every session touched), in process,
  next to a rewind over a log of the same sessions with one event each.
Recovery is designed to grow with sessions, not events: start-up verifies the
log head in O(1) and projections are kept transactionally with the log.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from session_service.log_store import LogStore
from session_service.sessions import SessionLimits, Sessions, new_session_id
from session_service.time_travel import TimeTravel
from switchboard.database import DatabaseSettings, TransactionRunner, open_backend
from switchboard.session.v1 import session_service_pb2 as pb

SESSIONS = 1000
RESULTS = Path(__file__).resolve().parent / "results" / "timetravel.json"


def seed(url: str, events: int, sessions: int = SESSIONS) -> int:
    """Opens `sessions` sessions through the real core, then bulk-loads message
    events into them (rows and projections exactly as appends would leave them).
    Returns the checkpoint sequence taken after the sessions were opened."""
    settings = DatabaseSettings(url=url)
    backend = open_backend(settings)
    store = LogStore(backend)
    store.create_schema()
    runner = TransactionRunner(backend, settings)
    core = Sessions(runner, store, SessionLimits())
    try:

        def open_all(now: float) -> list[str]:
            agent = pb.Agent(name="bench")
            core.log(now, [pb.Event(agent="bench", agent_created=pb.AgentCreated(agent=agent))])
            ids = []
            for n in range(sessions):
                source = pb.Source(transport="web", conversation_id=f"tab-{n}")
                session = core.open_session(
                    now, "bench", new_session_id(), f"agent:bench:web:tab-{n}", source
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
                session_id = ids[offset % sessions]
                version = 2 + (seq - mark - 1) // sessions
                event = pb.Event(agent="bench", session_id=session_id, session_version=version)
                event.sequence = seq
                event.time.FromNanoseconds(int(now * 1e9))
                event.message_appended.message.role = pb.ROLE_USER
                event.message_appended.message.content = f"message {seq} " + "x" * 80
                rows.append(
                    (seq, "bench", session_id, "message_appended", event.SerializeToString())
                )
            store.database.cursor().executemany(
                store._sql(
                    "INSERT INTO session_log (seq, agent, session_id, kind, payload) "
                    "VALUES (?, ?, ?, ?, ?)"
                ),
                rows,
            )
            store.Head.update(seq=first + count - 1).execute()

        total = per_session * sessions
        for first in range(mark + 1, mark + 1 + total, 50_000):
            count = min(50_000, mark + 1 + total - first)
            runner.submit_write(functools.partial(_load_at, load, first, count)).result()

        def fix_index(_now: float) -> None:
            head = store.head()
            for index, session_id in enumerate(ids):
                last = max(
                    s
                    for s in range(head - sessions + 1, head + 1)
                    if (s - mark - 1) % sessions == index
                )
                store.Session.update(last_seq=last, version=1 + per_session).where(
                    store.Session.session_id == session_id
                ).execute()

        runner.submit_write(fix_index).result()
        return int(mark)
    finally:
        runner.close()


def _load_at(load: Any, first: int, count: int, now: float) -> None:
    load(now, first, count)


def restart_seconds(url: str, data_dir: Path) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "serve", "session", "--session-listen",
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
    travel = TimeTravel(Sessions(runner, store, SessionLimits()))
    try:
        started = time.perf_counter()
        asyncio.run(travel.rewind(target, ""))
        return time.perf_counter() - started
    finally:
        runner.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k and 100k events only")
    args = parser.parse_args(argv)
    sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-timetravel-") as tmp:
        base = Path(tmp)
        empty = f"sqlite:///{base / 'empty.sqlite3'}"
        LogStore(open_backend(DatabaseSettings(url=empty))).create_schema()
        baseline_restart = restart_seconds(empty, base)
        small = f"sqlite:///{base / 'small.sqlite3'}"
        small_mark = seed(small, SESSIONS)
        baseline_rewind = rewind_seconds(small, small_mark)
        for size in sizes:
            url = f"sqlite:///{base / f'log-{size}.sqlite3'}"
            seeded = time.perf_counter()
            mark = seed(url, size)
            seed_s = time.perf_counter() - seeded
            restart = restart_seconds(url, base)
            rewind = rewind_seconds(url, mark)
            rows.append(
                {"events": size, "sessions": SESSIONS, "seed_s": round(seed_s, 2),
                 "restart_s": round(restart, 3), "rewind_s": round(rewind, 3)}
            )  # fmt: skip
            print(
                f"{size:>9,} events / {SESSIONS:,} sessions: restart {restart:6.3f} s "
                f"({restart / baseline_restart:4.2f} x empty log), rewind of everything "
                f"{rewind:6.3f} s ({rewind / baseline_rewind:5.2f} x {SESSIONS:,} one-event "
                f"sessions)",
                flush=True,
            )
    print(
        f"baselines: restart on an empty log {baseline_restart:.3f} s; rewind over "
        f"{SESSIONS:,} sessions of one event {baseline_rewind:.3f} s"
    )
    print("targets: rewind of 100k events in 1,000 sessions < 2 s; 1M-event restart < 10 s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "baseline_restart_s": baseline_restart,
                "baseline_rewind_s": baseline_rewind,
                "rows": rows,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
