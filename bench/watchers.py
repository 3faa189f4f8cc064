"""WatchEvents' fan-out against real server processes: what idle watchers cost appends,
what watchers that never read make a server hold, and NOTIFY's delivery latency.

    .venv/bin/python -m bench.watchers [--quick]

Against `switchboard serve session` processes (`bench.servers`), watchers held by this
process (grpc.aio, on a loop thread of its own), appends by `bench.session_load`:

- idle: AppendEvents, 8 clients (`bench.session_load --mode append`), with 0, 500 and
  2,000 idle watchers held open on one server (SQLite FULL, then Postgres in a fresh
  schema). Idle: each watches one of `IDLE_SESSIONS` sessions of another agent, which
  no append touches, so each costs the tailer an index lookup and the server its stream;
  they are spread over channels of `WATCHERS_PER_CHANNEL` streams (the server's
  --max-streams-per-connection is 1000). Each watcher has received one event (a
  catch-up) before the load starts, so it is registered. Ratio: appends/s over the
  0-watcher rate of the same server; RSS after the watchers opened (and its peak). A
  last point with every watcher closed again separates drift from their cost.
- stalled: 20 watchers (on 4 channels) of one session read one event and then nothing
  while `STALLED_EVENTS` events of 250 KB are appended to it (SQLite FULL, fresh server).
  Reported: the server's peak RSS growth over its RSS just before (VmHWM reset, VmRSS
  sampled every 20 ms); target < 200 MB. Then every watcher reads what it was sent, to
  its end: the statuses they end with (ABORTED WATCHER_TOO_SLOW is the design).
- notify: Postgres, two server processes on one fresh schema; a watcher of one session
  on B, `LATENCY_APPENDS` appends to it on A, one at a time, each awaited until B's
  watcher has it. Latency: from the append's start to the watcher's receipt (the append
  itself included). Baseline in the same run: the same with the watcher on A (woken by
  its own commit, no NOTIFY), and the append latency alone. Target: p99 < 100 ms.

Tables on stdout, progress on stderr, results in bench/results/watchers.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import grpc

from bench import servers
from bench.harness import RESULTS_DIR, log, percent, run_loadgen
from bench.preauth_memory import PeakRss, _status_kb
from bench.stats import percentile
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

T = TypeVar("T")

WATCHER_COUNTS = (0, 500, 2000)
WATCHERS_PER_CHANNEL = 500
IDLE_SESSIONS = 8
STALLED_WATCHERS = 20
STALLED_CHANNELS = 4
STALLED_EVENT_BYTES = 250_000
STALLED_EVENTS = 200
STALLED_TARGET_MB = 200
LATENCY_APPENDS = 500
LATENCY_TARGET_P99_MS = 100.0
RPC_TIMEOUT_S = 30.0
#: A watcher that sends nothing for this long while being read is taken as still open.
DRAIN_IDLE_S = 5.0
RESULTS = RESULTS_DIR / "watchers.json"


class LoopThread:
    """An asyncio loop on a thread of its own: the watchers stay open (and served by
    grpc.aio) while this process waits for a load generator."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float = 600.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    return round(_status_kb(pid, field_name) / 1024, 1)


# -- watchers -------------------------------------------------------------------------------


class Watchers:
    """Streams of WatchEvents held open over a few channels (on the loop thread)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.channels: list[grpc.aio.Channel] = []
        self.calls: list[Any] = []

    def stub(self, index: int, per_channel: int) -> pb_grpc.SessionServiceAsyncStub:
        while len(self.channels) <= index // per_channel:
            # A local subchannel pool gives every channel its own connection (else they
            # share one, and its --max-streams-per-connection).
            options = [("grpc.use_local_subchannel_pool", 1)]
            self.channels.append(grpc.aio.insecure_channel(self.address, options=options))
        return pb_grpc.SessionServiceStub(self.channels[index // per_channel])

    async def open(
        self, requests: list[pb.WatchEventsRequest], per_channel: int, parallel: int = 100
    ) -> None:
        """Opens one stream per request and reads its first event (so it is registered)."""
        gate = asyncio.Semaphore(parallel)

        async def one(index: int, request: pb.WatchEventsRequest) -> Any:
            async with gate:
                call = self.stub(index, per_channel).WatchEvents(request)
                first = await asyncio.wait_for(call.read(), RPC_TIMEOUT_S)
                if first is grpc.aio.EOF:
                    raise RuntimeError(f"watcher {index} ended before its first event")
                return call

        held = len(self.calls)  # new streams go on after those already open
        self.calls += await asyncio.gather(*(one(held + i, r) for i, r in enumerate(requests)))

    async def close(self) -> None:
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            await channel.close()
        self.calls, self.channels = [], []


async def drained_status(call: Any) -> tuple[str, int]:
    """Reads a stream to its end: its status (code, and ErrorInfo reason) and how many
    events it delivered; "still open" when it delivers nothing for DRAIN_IDLE_S."""
    received = 0
    try:
        while True:
            item = await asyncio.wait_for(call.read(), DRAIN_IDLE_S)
            if item is grpc.aio.EOF:
                return "OK (ended)", received
            received += 1
    except TimeoutError:
        call.cancel()
        return "still open", received
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name} {_reason(error)}".strip(), received


def _reason(error: grpc.aio.AioRpcError) -> str:
    from google.rpc import error_details_pb2, status_pb2

    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin" and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.ErrorInfo()
                if detail.Unpack(info):
                    return str(info.reason)
    return ""


# -- setup calls ----------------------------------------------------------------------------


async def new_agent(stub: pb_grpc.SessionServiceAsyncStub) -> str:
    name = f"bench-{uuid.uuid4().hex[:12]}"
    request = pb.CreateAgentRequest(agent=pb.Agent(name=name, display_name="bench agent"))
    await stub.CreateAgent(request, timeout=RPC_TIMEOUT_S)
    return name


async def new_session(stub: pb_grpc.SessionServiceAsyncStub, agent: str, tab: str) -> pb.Session:
    source = pb.Source(transport="web", conversation_id=tab)
    request = pb.ResolveSessionRequest(agent=agent, source=source)
    resolved = await stub.ResolveSession(request, timeout=RPC_TIMEOUT_S)
    return resolved.session


def message(content: str) -> pb.SessionEventInput:
    body = pb.Message(role=pb.ROLE_USER, content=content)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=body))


async def append(
    stub: pb_grpc.SessionServiceAsyncStub, agent: str, session_id: str, text: str
) -> int:
    request = pb.AppendEventsRequest(agent=agent, session_id=session_id, events=[message(text)])
    answer = await stub.AppendEvents(request, timeout=RPC_TIMEOUT_S)
    return int(answer.events[-1].sequence)


@contextmanager
def database(backend: str) -> Iterator[str]:
    if backend == "postgres":
        with servers.postgres_schema() as url:
            yield url
        return
    with servers.temp_dir("bench-watchers-db-") as directory:
        yield f"sqlite:///{directory}/session.sqlite3"


@contextmanager
def server(url: str) -> Iterator[servers.ServerProcess]:
    with (
        servers.temp_dir("bench-watchers-") as data_dir,
        servers.running_server(url, data_dir, service="session") as process,
    ):
        yield process


# -- (a) appends beside idle watchers ---------------------------------------------------------


async def idle_requests(address: str, count: int) -> list[pb.WatchEventsRequest]:
    """Watch requests of sessions no append touches, each starting one event back."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        agent = await new_agent(stub)
        sessions = [await new_session(stub, agent, f"idle-{n}") for n in range(IDLE_SESSIONS)]
    return [
        pb.WatchEventsRequest(
            session_id=sessions[n % IDLE_SESSIONS].session_id,
            after_sequence=sessions[n % IDLE_SESSIONS].last_sequence - 1,
        )
        for n in range(count)
    ]


def idle_series(backend: str, loop: LoopThread, seconds: float, warmup: float) -> list[Any]:
    rows: list[dict[str, Any]] = []
    with database(backend) as url, server(url) as process:
        watchers = Watchers(process.address)
        try:
            for count in (*WATCHER_COUNTS, 0):
                more = count - len(watchers.calls)
                if count == 0 and watchers.calls:
                    # The last point: all closed again, so drift (a longer log, a busier
                    # machine) shows apart from what the watchers cost.
                    loop.run(watchers.close())
                    time.sleep(1.0)
                if more > 0:
                    requests = loop.run(idle_requests(process.address, more))
                    started = time.perf_counter()
                    loop.run(watchers.open(requests, WATCHERS_PER_CHANNEL))
                    took = time.perf_counter() - started
                    log(f"[{backend}] {count} idle watchers open ({took:.1f} s)")
                rss_before = rss_mb(process.pid)
                peak = PeakRss(process.pid)
                measured = run_loadgen(
                    process,
                    "bench.session_load",
                    ["--mode", "append", "--clients", "8", "--seconds", str(seconds),
                     "--warmup", str(warmup)],
                    timeout_s=warmup + seconds + 120,
                )  # fmt: skip
                rows.append(
                    {
                        "backend": backend,
                        "watchers": count,
                        "after_closing": bool(rows) and count == 0,
                        "channels": len(watchers.channels),
                        "appends_per_s": round(measured.cycles_per_s, 1),
                        "p50_ms": round(measured.p50_ms, 2),
                        "p99_ms": round(measured.p99_ms, 2),
                        "errors": measured.errors,
                        "server_cpu_util": measured.extra.get("server_cpu_util"),
                        "rss_mb": rss_before,
                        "peak_rss_mb": round(peak.peak_kb() / 1024, 1),
                    }
                )
                log(f"[{backend}] {count} watchers: {rows[-1]['appends_per_s']:,.0f} appends/s")
        finally:
            loop.run(watchers.close())
    base = rows[0]["appends_per_s"]
    for row in rows:
        row["ratio"] = round(row["appends_per_s"] / base, 3) if base else None
    return rows


# -- (b) watchers that never read -------------------------------------------------------------


async def stalled_run(process: servers.ServerProcess, events: int) -> dict[str, Any]:
    watchers = Watchers(process.address)
    async with grpc.aio.insecure_channel(process.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        agent = await new_agent(stub)
        session = await new_session(stub, agent, "stalled")
        request = pb.WatchEventsRequest(
            session_id=session.session_id, after_sequence=session.last_sequence - 1
        )
        per_channel = STALLED_WATCHERS // STALLED_CHANNELS
        await watchers.open([request] * STALLED_WATCHERS, per_channel)
        rss_before = rss_mb(process.pid)
        peak = PeakRss(process.pid)
        filler = "x" * (STALLED_EVENT_BYTES - 16)
        started = time.perf_counter()
        last = 0
        for n in range(events):
            last = await append(stub, agent, session.session_id, f"{n:>15} {filler}")
        appended_s = time.perf_counter() - started
        await asyncio.sleep(1.0)  # what the server still does with them after the last commit
        peak_mb = round(peak.peak_kb() / 1024, 1)
        rss_after = rss_mb(process.pid)
        ended = await asyncio.gather(*(drained_status(call) for call in watchers.calls))
        await watchers.close()
    statuses = Counter(status for status, _ in ended)
    received = sorted(count for _, count in ended)
    return {
        "watchers": STALLED_WATCHERS,
        "events": events,
        "event_bytes": STALLED_EVENT_BYTES,
        "appended_mb": round(events * STALLED_EVENT_BYTES / 1e6, 1),
        "append_s": round(appended_s, 2),
        "last_sequence": last,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_mb,
        "growth_mb": round(peak_mb - rss_before, 1),
        "rss_after_mb": rss_after,
        "target_mb": STALLED_TARGET_MB,
        "statuses": dict(statuses),
        "events_received_min_max": [received[0], received[-1]] if received else [],
    }


def stalled_series(loop: LoopThread, events: int) -> dict[str, Any]:
    with database("sqlite") as url, server(url) as process:
        result = loop.run(stalled_run(process, events))
    log(f"[stalled] peak growth {result['growth_mb']} MB; {result['statuses']}")
    return {"backend": "sqlite", **result}


# -- (c) delivery latency by NOTIFY -----------------------------------------------------------


async def delivery_latencies(
    writer: str, watcher_at: str, appends: int
) -> tuple[list[float], list[float]]:
    """(delivery, append) latencies in seconds: appends on `writer`, one watcher on
    `watcher_at`, each append awaited until the watcher has its event."""
    async with (
        grpc.aio.insecure_channel(writer) as write_channel,
        grpc.aio.insecure_channel(watcher_at) as watch_channel,
    ):
        stub = pb_grpc.SessionServiceStub(write_channel)
        agent = await new_agent(stub)
        session = await new_session(stub, agent, f"latency-{uuid.uuid4().hex[:6]}")
        watch = pb_grpc.SessionServiceStub(watch_channel).WatchEvents(
            pb.WatchEventsRequest(
                session_id=session.session_id, after_sequence=session.last_sequence - 1
            )
        )
        await asyncio.wait_for(watch.read(), RPC_TIMEOUT_S)  # registered on its server
        delivery: list[float] = []
        answered: list[float] = []
        try:
            for n in range(appends + 20):
                receipt: Awaitable[Any] = asyncio.ensure_future(watch.read())
                began = time.perf_counter()
                sequence = await append(stub, agent, session.session_id, f"latency {n}")
                acknowledged = time.perf_counter()
                item = await asyncio.wait_for(receipt, RPC_TIMEOUT_S)
                received = time.perf_counter()
                if item is grpc.aio.EOF or item.event.sequence != sequence:
                    raise RuntimeError(f"the watcher got {item!r}, expected sequence {sequence}")
                if n >= 20:  # the first ones warm both servers
                    delivery.append(received - began)
                    answered.append(acknowledged - began)
        finally:
            watch.cancel()
    return delivery, answered


def _latency_row(name: str, values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "path": name,
        "samples": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5) * 1000, 2),
        "p99_ms": round(percentile(ordered, 0.99) * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2) if ordered else None,
    }


def notify_series(loop: LoopThread, appends: int) -> list[dict[str, Any]]:
    with database("postgres") as url, server(url) as replica_a, server(url) as replica_b:
        other, appended = loop.run(
            delivery_latencies(replica_a.address, replica_b.address, appends)
        )
        local, _ = loop.run(delivery_latencies(replica_a.address, replica_a.address, appends))
    rows = [
        _latency_row("watcher on B, appends on A (NOTIFY)", other),
        _latency_row("watcher on A, appends on A (local wake)", local),
        _latency_row("the append alone (A)", appended),
    ]
    rows[0]["target_p99_ms"] = LATENCY_TARGET_P99_MS
    log(f"[notify] p50 {rows[0]['p50_ms']} ms, p99 {rows[0]['p99_ms']} ms")
    return rows


# -- report -----------------------------------------------------------------------------------


def report(results: dict[str, Any]) -> str:
    lines = ["AppendEvents (8 clients) beside idle watchers"]
    lines.append(
        f"{'backend':9} {'watchers':>8} {'chans':>5} | {'appends/s':>9} {'ratio':>6} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'err':>4} {'srv CPU':>7} | {'RSS MB':>7} {'peak MB':>8}"
    )
    for r in results["idle"]:
        watchers = "0 again" if r["after_closing"] else str(r["watchers"])
        lines.append(
            f"{r['backend']:9} {watchers:>8} {r['channels']:>5} | "
            f"{r['appends_per_s']:>9,.0f} {r['ratio']:>6.3f} {r['p50_ms']:>7.2f} "
            f"{r['p99_ms']:>7.2f} {r['errors']:>4} {percent(r['server_cpu_util']):>7} | "
            f"{r['rss_mb']:>7.1f} {r['peak_rss_mb']:>8.1f}"
        )
    s = results.get("stalled")
    if s:
        verdict = "met" if s["growth_mb"] < s["target_mb"] else "MISSED"
        lines += [
            "",
            f"{s['watchers']} watchers that never read, {s['events']} events of "
            f"{s['event_bytes']:,} bytes ({s['appended_mb']} MB) appended in {s['append_s']} s "
            f"({s['backend']})",
            f"  server RSS {s['rss_before_mb']} MB before, peak {s['peak_rss_mb']} MB: growth "
            f"{s['growth_mb']} MB (target < {s['target_mb']} MB: {verdict}); "
            f"{s['rss_after_mb']} MB after",
            f"  watchers ended: {s['statuses']}; events each received: "
            f"{s['events_received_min_max']} (min, max)",
        ]
    if results.get("notify"):
        lines += ["", "Delivery latency, Postgres, two server processes on one database"]
        lines.append(f"{'path':42} {'n':>4} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7}")
        for r in results["notify"]:
            lines.append(
                f"{r['path']:42} {r['samples']:>4} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
                f"{r['max_ms']:>7.2f}"
            )
        first = results["notify"][0]
        verdict = "met" if first["p99_ms"] < LATENCY_TARGET_P99_MS else "MISSED"
        lines.append(f"target p99 < {LATENCY_TARGET_P99_MS:g} ms across replicas: {verdict}")
    return "\n".join(lines + [f"notes: {note}" for note in results["notes"]])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer events")
    args = parser.parse_args(argv)
    seconds, warmup = (3.0, 1.0) if args.quick else (6.0, 2.0)
    notes: list[str] = []
    backends = ["sqlite"]
    down = servers.postgres_unreachable_reason()
    if down is None:
        backends.append("postgres")
    else:
        notes.append(f"postgres parts skipped: {down}")
    load_start = Path("/proc/loadavg").read_text().split()[:3]
    loop = LoopThread()
    try:
        idle = [row for b in backends for row in idle_series(b, loop, seconds, warmup)]
        stalled = stalled_series(loop, STALLED_EVENTS // 2 if args.quick else STALLED_EVENTS)
        appends = LATENCY_APPENDS // 2 if args.quick else LATENCY_APPENDS
        notify = notify_series(loop, appends) if "postgres" in backends else []
    finally:
        loop.close()
    notes.append(
        f"load average {' '.join(load_start)} at start, "
        f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])} at end"
    )
    results = {
        "quick": args.quick,
        "seconds": seconds,
        "idle": idle,
        "stalled": stalled,
        "notify": notify,
        "notes": notes,
    }
    print(report(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print(f"results: {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
