"""The section `console`: the operator console's render times against the log's size, and
what its live tail costs (issue 24: flat in the log's size, at most 1.5x from the
smallest log to the largest).

For each selected backend of SQLite FULL and Postgres and each log size (1,000, 100,000
and 1,000,000 events; quick: 1,000, 10,000, 100,000), a fresh database is seeded
through the session core's write path (`bench.seeding`: `SESSIONS` sessions of one
agent, events round robin), both services are served as `switchboard serve` processes
and the console runs in this process. One client then times `CALLS` requests (after a
warm-up) of the timeline at the head and of the sessions page (100 rows, with their
owed replies): p50 and p99, and each size's p50 over the smallest's.

On the smallest log, the live tail: `BROWSERS` browsers follow the timeline (SSE)
while `APPENDS` events are appended: the watch streams the console opened, the events
each browser received, and the CPU the session service spent meanwhile (the same for
few and many: browsers are served from the console's memory).
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from typing import Any

import grpc
import httpx

from bench import seeding, servers
from bench.plan import Context, Section
from bench.report import table
from bench.servers import Backend, ServerProcess
from bench.stats import cpu_delta, thread_cpu
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_console.server import ConsoleServer
from switchboard_console.web import Console, ConsoleSettings
from tests.harness import EventLoopThread

SESSIONS = 120
BATCH = 1_000
CALLS = 40
WARM_UP = 5
BROWSERS = (1, 50)
APPENDS = 200
#: Waits for browsers to join or leave, and for their events.
WAIT_S = 30.0


def seed(url: str, events: int) -> None:
    """One agent, SESSIONS sessions, `events` events in all (temp-state changes)."""
    with seeding.session_unit(url) as unit:
        ids = seeding.open_sessions(unit.core, "bench", SESSIONS)
        per_session = max(1, (events - 1 - SESSIONS) // SESSIONS)
        seeding.seed_events(unit.core, ids, per_session, _change, BATCH)
        seeding.analyze(unit.core)


def _change(i: int) -> Any:
    return seeding.temp_state(str(i))


@contextmanager
def deployment(url: str) -> Iterator[tuple[ServerProcess, str, Console]]:
    """Both services as processes on `url`, the console in this process; (the session
    server, the console's base URL, the console)."""
    with ExitStack() as stack:
        data = stack.enter_context(servers.temp_dir("bench-console-"))
        quiet = ("--access-log", "off")
        session = stack.enter_context(servers.started("session", url, data, extra=quiet))
        delivery = stack.enter_context(servers.started("delivery", url, data, extra=quiet))
        loop = EventLoopThread()
        stack.callback(loop.close)
        server = ConsoleServer(ConsoleSettings(session.address, delivery.address, "127.0.0.1:0"))
        address = loop.run(server.start())
        stack.callback(loop.run, server.stop())
        yield session, f"http://{address}", server.console


def _logged_in(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=30)
    answer = client.post("/login", data={"token": ""}, headers={"origin": base})
    if answer.status_code not in (200, 303):
        raise RuntimeError(f"console login answered {answer.status_code}: {answer.text[:300]}")
    return client


def _timed(client: httpx.Client, path: str, calls: int) -> dict[str, float]:
    samples = []
    for call in range(WARM_UP + calls):
        began = time.perf_counter()
        answer = client.get(path)
        if answer.status_code != 200:
            raise RuntimeError(f"GET {path} answered {answer.status_code}: {answer.text[-300:]}")
        if call >= WARM_UP:
            samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(0.99 * (len(samples) - 1))]}


def _append(stub: pb_grpc.SessionServiceStub, session_id: str, event: Any) -> None:
    stub.AppendEvents(pb.AppendEventsRequest(agent="bench", session_id=session_id, events=[event]))


def _live_tail(session: ServerProcess, base: str, console: Console) -> list[dict[str, Any]]:
    hub = console.hub
    assert hub is not None, "the console has no live hub"
    with grpc.insecure_channel(session.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        listed = stub.ListSessions(pb.ListSessionsRequest(agent="bench", page_size=1))
        tail = functools.partial(_tail, stub, listed.sessions[0].session_id, session, base, hub)
        return [tail(browsers) for browsers in BROWSERS]


def _tail(
    stub: pb_grpc.SessionServiceStub,
    session_id: str,
    session: ServerProcess,
    base: str,
    hub: Any,
    browsers: int,
) -> dict[str, Any]:
    """`browsers` browsers follow the timeline while APPENDS events are appended."""
    head = stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=1)).head_sequence
    opened, received, done = hub.streams_opened, [0] * browsers, threading.Event()
    follow = functools.partial(_follow, base, head, received, done)
    threads = [threading.Thread(target=follow, args=(n,), daemon=True) for n in range(browsers)]
    for thread in threads:
        thread.start()
    _wait(lambda: hub.follower_count >= browsers)
    before = thread_cpu(session.pid)
    for number in range(APPENDS):
        change = pb.TempStateChanged(set={"live": str(number)})
        _append(stub, session_id, pb.SessionEventInput(temp_state_changed=change))
    _wait(lambda: min(received) >= APPENDS)
    cpu = sum(t.cpu_s for t in cpu_delta(before, thread_cpu(session.pid)))
    streams = hub.streams_opened - opened
    done.set()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    # The console notices a browser left at its next event: send some until all have, so
    # that the next count starts without followers (and without their stream).
    deadline = time.monotonic() + WAIT_S
    while hub.follower_count and time.monotonic() < deadline:
        _append(stub, session_id, pb.SessionEventInput(task_cleared=pb.TaskCleared()))
        time.sleep(0.1)
    return {
        "browsers": browsers,
        "streams_opened": streams,
        "min_events_received": min(received),
        "session_service_cpu_s": round(cpu, 3),
    }


def _wait(done: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


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


def _backend_run(backend: Backend, ctx: Context) -> dict[str, Any]:
    sizes = ctx.scale.pick((1_000, 100_000, 1_000_000), (1_000, 10_000, 100_000), (300, 600))
    renders: list[dict[str, Any]] = []
    live: list[dict[str, Any]] = []
    calls = ctx.scale.pick(CALLS, CALLS, 5)
    for size in sizes:
        with (
            servers.temp_dir("bench-console-db-") as directory,
            servers.database(backend, directory) as url,
        ):
            ctx.say(f"[console] {backend.key}: seeding {size:,} events")
            seed(url, size)
            with deployment(url) as (session, base, console), closing(_logged_in(base)) as client:
                timeline, sessions = _timed(client, "/", calls), _timed(client, "/sessions", calls)
                renders.append({"events": size, "timeline": timeline, "sessions": sessions})
                if size == sizes[0]:
                    live = _live_tail(session, base, console)
    return {"backend": backend.key, "renders": renders, "live_tail": live}


def run(ctx: Context) -> Section:
    results = [_backend_run(b, ctx) for b in ctx.backends if b.key in ("sqlite-full", "postgres")]
    rows, live_rows = [], []
    for result in results:
        first = result["renders"][0]
        for row in result["renders"]:
            cells = [
                cell
                for page in ("timeline", "sessions")
                for cell in (
                    f"{row[page]['p50_ms']:.1f}",
                    f"{row[page]['p99_ms']:.1f}",
                    f"{row[page]['p50_ms'] / first[page]['p50_ms']:.2f} x",
                )
            ]
            rows.append((result["backend"], f"{row['events']:,}", *cells))
        for live in result["live_tail"]:
            live_rows.append(
                (
                    result["backend"],
                    str(live["browsers"]),
                    str(live["streams_opened"]),
                    f"{live['min_events_received']}/{APPENDS}",
                    f"{live['session_service_cpu_s']:.2f}",
                )
            )
    header = (
        "backend",
        "events",
        "timeline p50 ms",
        "p99 ms",
        "vs smallest",
        "sessions p50 ms",
        "p99 ms",
        "vs smallest",
    )
    renders = table(header, rows, "server time to render, one client; goal: vs smallest <= 1.5 x")
    live_header = ("backend", "browsers", "watch streams", "events each", "session CPU s")
    tail = table(live_header, live_rows, f"{APPENDS} events appended while the browsers follow")
    title = "The console: render times against the log's size, and the live tail"
    return Section("console", title, f"{renders}\n\n{tail}", {"results": results})
