"""The console's render times against the log's size, and what its live tail costs.

    .venv/bin/python -m bench.console [--quick] [--only sqlite|postgres]

For each backend and log size (1,000, 100,000 and 1,000,000 events; --quick:
1,000, 10,000, 100,000), a fresh database is seeded through the session core's own
write path (`Core.log`, BATCH events per transaction, round robin over SESSIONS
sessions of one agent), both services are served as `switchboard serve` processes
and the console in this process. Then, one client, CALLS requests each after a
warm-up: the timeline at the head (a window of `timeline.WINDOW_EVENTS` events)
and the sessions page (100 rows, with their owed replies). Printed: p50 and p99 in
ms, and each size's p50 over the smallest's (the goal: at most 1.5).

Then, on the smallest log, the live tail: BROWSERS_FEW and BROWSERS_MANY browsers
follow the timeline (SSE) while APPENDS events are appended; printed per count: the
watch streams the console opened, the events each browser received, and the CPU the
session service spent meanwhile (the same for few and many: the browsers are served
from the console's memory). Results: bench/results/console.json.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx

from bench.servers import (
    ServerProcess,
    cpu_delta,
    postgres_schema,
    postgres_unreachable_reason,
    running_server,
    temp_dir,
    thread_cpu,
)
from session_service import convert, records
from session_service.agents import Agents
from session_service.app import SessionUnit
from session_service.conversations import Conversations, new_session_id
from switchboard.database import DatabaseSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_console.server import ConsoleServer
from switchboard_console.web import Console, ConsoleSettings

SIZES = (1_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000, 100_000)
SESSIONS = 120
BATCH = 1_000
CALLS = 40
WARM_UP = 5
BROWSERS_FEW, BROWSERS_MANY = 1, 50
APPENDS = 200
RESULTS = Path(__file__).resolve().parent / "results" / "console.json"


def _temp(value: str) -> pb.Event:
    event = pb.Event()
    event.temp_state_changed.set["last"] = value
    return event


def seed(url: str, events: int, say: Callable[[str], None]) -> None:
    """One agent, SESSIONS sessions, `events` events in all (round robin)."""
    unit = SessionUnit(DatabaseSettings(url=url))
    try:
        core = unit.core
        conversations = Conversations(core, Agents(core))

        def opened(now: float) -> list[str]:
            agent = pb.Event(
                agent="bench", agent_created=pb.AgentCreated(agent=pb.Agent(name="bench"))
            )
            core.log(now, [convert.event(agent)])
            ids = []
            for number in range(SESSIONS):
                source = records.Source(transport="web", conversation_id=f"tab-{number}")
                key = f"agent:bench:web:tab-{number}"
                ids.append(
                    conversations.open_session(
                        now, "bench", new_session_id(), key, source
                    ).session_id
                )
            return ids

        session_ids: list[str] = unit.runner.submit_write(opened).result()
        left = events - 1 - SESSIONS
        started = time.perf_counter()
        number = 0
        while left > 0:
            count = min(BATCH, left)
            session_id = session_ids[number % len(session_ids)]
            unit.runner.submit_write(_appending(core, session_id, count, number)).result()
            left -= count
            number += 1
        if unit.store.backend.name == "postgres":
            unit.runner.submit_write(
                lambda _now: unit.store.database.execute_sql("ANALYZE")
            ).result()
        say(f"  seeded {events:,} events in {time.perf_counter() - started:.1f} s")
    finally:
        unit.runner.close()


def _appending(core: Any, session_id: str, count: int, batch: int) -> Callable[[float], None]:
    def op(now: float) -> None:
        index = core.store.session_index(session_id)
        assert index is not None
        bodies = [_temp(f"{batch}-{i}") for i in range(count)]
        for offset, event in enumerate(bodies):
            event.agent, event.session_id = "bench", session_id
            event.session_version = index.version + offset + 1
        core.log(now, [convert.event(body) for body in bodies], index)

    return op


class _Loop:
    """An event loop on its own thread, for the console."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@contextmanager
def deployment(url: str) -> Iterator[tuple[ServerProcess, ServerProcess, str, Console]]:
    """Both services as processes on `url` and the console in this process."""
    with ExitStack() as stack:
        data = stack.enter_context(temp_dir("bench-console"))
        quiet = ("--access-log", "off")
        session = stack.enter_context(
            running_server(url, data, service="session", extra_args=quiet)
        )
        delivery = stack.enter_context(
            running_server(url, data, service="delivery", extra_args=quiet)
        )
        loop = _Loop()
        stack.callback(loop.close)
        server = ConsoleServer(ConsoleSettings(session.address, delivery.address, "127.0.0.1:0"))
        address = loop.run(server.start())
        stack.callback(loop.run, server.stop())
        yield session, delivery, f"http://{address}", server.console


def _logged_in(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=30)
    answer = client.post("/login", data={"token": ""}, headers={"origin": base})
    assert answer.status_code in (200, 303), answer.text[:300]
    return client


def _timed(client: httpx.Client, path: str) -> dict[str, float]:
    for _ in range(WARM_UP):
        assert client.get(path).status_code == 200
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        answer = client.get(path)
        samples.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text[-300:]
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(0.99 * (len(samples) - 1))]}


def _live_tail(session: ServerProcess, base: str, console: Console) -> list[dict[str, Any]]:
    hub = console.hub
    assert hub is not None
    stub = pb_grpc.SessionServiceStub(grpc.insecure_channel(session.address))
    session_id = (
        stub.ListSessions(pb.ListSessionsRequest(agent="bench", page_size=1)).sessions[0].session_id
    )
    found = []
    for browsers in (BROWSERS_FEW, BROWSERS_MANY):
        head = stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=1)).head_sequence
        opened = hub.streams_opened
        received = [0] * browsers
        done = threading.Event()

        follow = functools.partial(_follow, base, head, received, done)
        threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in range(browsers)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while hub.follower_count < browsers and time.monotonic() < deadline:
            time.sleep(0.05)
        before = thread_cpu(session.pid)
        for number in range(APPENDS):
            change = pb.TempStateChanged(set={"live": str(number)})
            stub.AppendEvents(
                pb.AppendEventsRequest(
                    agent="bench",
                    session_id=session_id,
                    events=[pb.SessionEventInput(temp_state_changed=change)],
                )
            )
        deadline = time.monotonic() + 30
        while min(received) < APPENDS and time.monotonic() < deadline:
            time.sleep(0.05)
        streams = hub.streams_opened - opened
        cpu = sum(t.cpu_s for t in cpu_delta(before, thread_cpu(session.pid)))
        done.set()
        for thread in threads:
            thread.join(timeout=30)
        # The console notices a browser left at its next event or ping: wait for it, so
        # that the next count starts without followers (and without a stream).
        deadline = time.monotonic() + 30
        while hub.follower_count and time.monotonic() < deadline:
            stub.AppendEvents(
                pb.AppendEventsRequest(
                    agent="bench",
                    session_id=session_id,
                    events=[pb.SessionEventInput(task_cleared=pb.TaskCleared())],
                )
            )
            time.sleep(0.1)
        found.append(
            {
                "browsers": browsers,
                "streams_opened": streams,
                "min_events_received": min(received),
                "session_service_cpu_s": round(cpu, 3),
            }
        )
    return found


def _follow(base: str, head: int, received: list[int], done: threading.Event, number: int) -> None:
    """One browser following the timeline: counts the events it receives."""
    with (
        closing(_logged_in(base)) as client,
        client.stream("GET", f"/live?after={head}", timeout=60) as stream,
    ):
        for line in stream.iter_lines():
            if line.startswith("id: "):
                received[number] += 1
            if received[number] >= APPENDS or done.is_set():
                return


def run(
    backend: str, url_for: Callable[[], Any], sizes: tuple[int, ...], say: Callable[[str], None]
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    live: list[dict[str, Any]] = []
    for size in sizes:
        with url_for() as url:
            say(f"{backend}: {size:,} events")
            seed(url, size, say)
            with (
                deployment(url) as (session, _delivery, base, console),
                closing(_logged_in(base)) as client,
            ):
                rows.append(
                    {
                        "events": size,
                        "timeline": _timed(client, "/"),
                        "sessions": _timed(client, "/sessions"),
                    }
                )
                if size == sizes[0]:
                    live = _live_tail(session, base, console)
    return {"backend": backend, "renders": rows, "live_tail": live}


def report(result: dict[str, Any]) -> str:
    lines = [
        f"{result['backend']}: server time to render "
        "(ms, p50 / p99; ratio of p50 to the smallest log)"
    ]
    first = result["renders"][0]
    for row in result["renders"]:
        cells = []
        for page in ("timeline", "sessions"):
            ratio = row[page]["p50_ms"] / first[page]["p50_ms"]
            cells.append(
                f"{page} {row[page]['p50_ms']:6.1f} / {row[page]['p99_ms']:6.1f} (x{ratio:.2f})"
            )
        lines.append(f"  {row['events']:>9,} events: " + "   ".join(cells))
    for live in result["live_tail"]:
        lines.append(
            f"  live tail, {live['browsers']:>2} browsers: "
            f"{live['streams_opened']} watch stream(s) opened, "
            f"each got {live['min_events_received']}/{APPENDS} events, session service CPU "
            f"{live['session_service_cpu_s']:.2f} s"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="logs of 1k, 10k and 100k events")
    parser.add_argument("--only", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES

    def say(message: str) -> None:
        print(message, flush=True)

    if args.only == "postgres":
        reason = postgres_unreachable_reason()
        if reason:
            raise SystemExit(reason)
        result = run("postgres", postgres_schema, sizes, say)
    else:

        @contextmanager
        def sqlite_url() -> Iterator[str]:
            with temp_dir("bench-console-db") as folder:
                yield f"sqlite:///{folder / 'switchboard.sqlite3'}"

        result = run("sqlite", sqlite_url, sizes, say)
    print(report(result))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
