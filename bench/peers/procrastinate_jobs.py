"""procrastinate's job cycle on Postgres (psycopg 3), in process, in a fresh schema.

One job per reply: a deferrer defers jobs carrying the benchmark's message back
to back (each defer a committed INSERT), at most `IN_FLIGHT` unfinished at once
(as 8 closed-loop clients would; an unbounded backlog would only measure its own
length in the latencies), while a worker in the same event loop
fetches each job (LISTEN/NOTIFY, polling as fallback), runs a task that only
notes the time, and marks it finished: defer + fetch + finish, each its own
transaction, as Switchboard's delivery cycle is record + attempting + delivered.
The figure is jobs finished per second inside the window (the slower of deferring
and working sets it), the latency from a job's defer to its task's run. Worker
concurrency 1 and 4; the better is the peer's figure.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.peers.common import PeerResult, user_message
from bench.stats import Measurement, summarise

CONCURRENCY = (1, 4)
QUEUE = "bench"
IN_FLIGHT = 8


async def _cycle(url: str, concurrency: int, seconds: float, warmup_s: float) -> Measurement:
    from procrastinate import App, PsycopgConnector

    app = App(connector=PsycopgConnector(conninfo=url))
    deferred_at: dict[int, float] = {}
    finished_at: dict[int, float] = {}
    in_flight = asyncio.Semaphore(IN_FLIGHT)

    async def reply_run(number: int, content: str) -> None:
        finished_at[number] = time.perf_counter()
        in_flight.release()

    reply = app.task(name="bench_reply", queue=QUEUE)(reply_run)

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        worker = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE],
                concurrency=concurrency,
                wait=True,
                install_signal_handlers=False,
                fetch_job_polling_interval=0.5,
            )
        )
        measure_from = time.perf_counter() + warmup_s
        stop_at = measure_from + seconds
        i = 0
        while True:
            await in_flight.acquire()
            if (began := time.perf_counter()) >= stop_at:
                break
            deferred_at[i] = began
            await reply.defer_async(number=i, content=user_message(i))
            i += 1
        # Jobs still queued at the window's end are not counted; let the worker go.
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    in_window = [n for n, t in finished_at.items() if measure_from <= t <= stop_at]
    latencies = [
        finished_at[n] - deferred_at[n] for n in in_window if deferred_at[n] >= measure_from
    ]
    measurement = summarise(
        f"procrastinate job cycle, worker concurrency {concurrency}",
        IN_FLIGHT,
        seconds,
        latencies,
        len(in_window),
    )
    measurement.extra = {"deferred": i, "finished": len(finished_at)}
    return measurement


def measure(schema_url: Any, seconds: float, warmup_s: float) -> list[PeerResult]:
    """`schema_url()` is a context manager yielding the URL of a fresh schema, per run."""
    best: Measurement | None = None
    runs = []
    for concurrency in CONCURRENCY:
        with schema_url() as url:
            measurement = asyncio.run(_cycle(url, concurrency, seconds, warmup_s))
        runs.append(measurement.to_json())
        if best is None or measurement.cycles_per_s > best.cycles_per_s:
            best = measurement
    return [
        PeerResult(
            "procrastinate-job-cycle",
            "procrastinate job cycle (defer + fetch + finish)",
            "rate",
            best,
            settings="Postgres, psycopg 3 pool, fresh schema; best of worker concurrency "
            + " and ".join(str(c) for c in CONCURRENCY),
            extra={"runs": runs},
        )
    ]
