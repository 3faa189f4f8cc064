"""The load generator: one process, either service, any workload, closed or open loop.

    python -m bench.loadgen --address 127.0.0.1:PORT --workload append --clients 8 \
        --channels 2 --seconds 10 --warmup-s 2
    python -m bench.loadgen --address 127.0.0.1:PORT --workload cycle --clients 32 --rate 500

It runs as a process of its own, never inside the server's or the runner's, and prints
one `bench.stats.Measurement` as JSON on stdout. The workloads are `bench.workloads`'s;
the command line is `Load`'s fields, so that `run` (the runner's side) and `main` (this
process) read the same description.

- Closed loop (`--rate 0`): `clients` coroutines over `channels` channels (each its own
  HTTP/2 connection), each awaiting its operation before starting the next; counted by
  `bench.stats.Window` (warm-up not counted). A workload that runs out of work (a claim)
  ends its window at the end of its last operation that did some.
- Open loop (`--rate R`): operation k is due at t0 + k / R and starts then whatever is
  still running, on lane k mod `clients`; its latency runs from when it was *due*, so
  waiting in either process's queues counts. Operations due in the warm-up are not
  measured; the achieved rate counts those that finished inside the window. An
  operation still running after `OP_TIMEOUT_S` is cancelled and counted as an error.

`SWITCHBOARD_BENCH_REQUEST_IDS=1` in the runner's environment makes every load send a
fresh request id with each write (AIP-155), so the server also records the request
and its answer in the write's transaction.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import grpc

from bench import workloads
from bench.stats import Measurement, Window, cpu_delta, percentile, summarise, thread_cpu

REPO_ROOT = Path(__file__).resolve().parent.parent
#: Deadline of one open-loop operation (all its RPCs), counted from when it started.
OP_TIMEOUT_S = 10.0
#: Most events a `turn` session is seeded with (keeps seeding bounded).
MAX_EVENTS = 100_000


def _request_ids_default() -> bool:
    return os.environ.get("SWITCHBOARD_BENCH_REQUEST_IDS", "") == "1"


@dataclass(frozen=True)
class Load:
    """One run of the load generator (see the module doc); its fields are its flags."""

    workload: str
    clients: int = 1
    channels: int = 1
    seconds: float = 3.0
    warmup_s: float = 1.0
    #: Operations started per second (open loop); 0: closed loop.
    rate: float = 0.0
    #: noop: Health/Check calls per operation.
    rpcs: int = 1
    #: turn: message events the session is seeded with.
    events: int = 1000
    #: claim: the rows seeded, all of which must be claimed.
    expect: int = 0
    #: claim: rows per ClaimRecoverable call (the server's maximum).
    limit: int = 1000
    request_ids: bool = field(default_factory=_request_ids_default)

    def arguments(self) -> list[str]:
        values = asdict(self)
        return [f"--{name.replace('_', '-')}={_flag(values[name])}" for name in values]

    def problem(self) -> str:
        """What makes this load impossible, or ""."""
        if self.workload not in WORKLOADS:
            return f"workload must be one of {', '.join(WORKLOADS)}"
        if self.clients < 1 or self.channels < 1 or self.seconds <= 0 or self.warmup_s < 0:
            return "clients and channels must be >= 1, seconds > 0, warmup >= 0"
        if self.rate < 0 or self.rpcs < 1:
            return "rate must be >= 0 and rpcs >= 1"
        if self.workload == "turn" and not 1 <= self.events <= MAX_EVENTS:
            return f"turn: events must be 1..{MAX_EVENTS:,}"
        if self.workload == "claim" and (self.expect < 1 or not 1 <= self.limit <= 1000):
            return "claim: expect must be >= 1 and limit 1..1000"
        return ""


def _flag(value: Any) -> str:
    return str(int(value)) if isinstance(value, bool) else str(value)


def build(load: Load) -> workloads.Workload:
    """The workload `load` names, configured."""
    made: workloads.Workload = WORKLOADS[load.workload](request_ids=load.request_ids)
    made.over_stream = load.workload.endswith("-stream")
    if isinstance(made, workloads.Noop):
        made.rpcs_per_op = load.rpcs
    elif isinstance(made, workloads.Turn):
        made.events = load.events
    elif isinstance(made, workloads.Cycle) and load.workload.startswith("cycle2"):
        made.begin_attempt, made.rpcs_per_op = True, 2
    elif isinstance(made, workloads.Claim):
        made.expect, made.limit = load.expect, load.limit
    return made


WORKLOADS: dict[str, type[workloads.Workload]] = {
    "noop": workloads.Noop,
    "append": workloads.Append,
    "turn": workloads.Turn,
    "cycle": workloads.Cycle,
    "cycle2": workloads.Cycle,
    "claim": workloads.Claim,
    "append-stream": workloads.Append,
    "cycle2-stream": workloads.Cycle,
}


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"[:300]
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


# -- closed loop --------------------------------------------------------------------------------


async def closed_loop(workload: workloads.Workload, load: Load) -> tuple[Window, list[str]]:
    """`load.clients` clients back to back; the window and what failed."""
    window = Window(load.warmup_s, load.seconds)
    failures: list[str] = []
    last_ended = window.started
    exhausted = False

    async def client(lane: int) -> None:
        nonlocal last_ended, exhausted
        i = 0
        try:
            while window.open():
                began = time.perf_counter()
                items = await workload.op(lane, i)
                ended = time.perf_counter()
                i += 1
                if not window.record(began, ended, items):
                    return
                last_ended = max(last_ended, ended)
        except workloads.Exhausted:
            exhausted = True
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            failures.append(_first_line(exc))

    limit_s = load.warmup_s + load.seconds + 4 * workloads.RPC_TIMEOUT_S
    await asyncio.wait_for(asyncio.gather(*(client(n) for n in range(load.clients))), limit_s)
    if exhausted:  # the work ran out: the window ends with the last operation that did some
        window.seconds = max(last_ended - window.measure_from, 1e-9)
    return window, failures


# -- open loop ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    due: float
    started: float = 0.0
    ended: float = 0.0
    error: str = ""
    ok: bool = False


@dataclass
class Schedule:
    """The open loop's operations, and how many ran at once."""

    outcomes: list[Outcome] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def one(self, workload: workloads.Workload, lanes: int, k: int) -> None:
        outcome = self.outcomes[k]
        outcome.started = time.perf_counter()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.wait_for(workload.op(k % lanes, k), timeout=OP_TIMEOUT_S)
            outcome.ok = True
        except (grpc.aio.AioRpcError, RuntimeError, TimeoutError) as exc:
            # wait_for cancels an operation at OP_TIMEOUT_S; the RPC it was in may then
            # surface as CANCELLED rather than as the timeout it is.
            late = time.perf_counter() - outcome.started >= OP_TIMEOUT_S - 0.05
            outcome.error = f"timed out after {OP_TIMEOUT_S:g} s" if late else _first_line(exc)
        finally:
            outcome.ended = time.perf_counter()
            self.in_flight -= 1


async def open_loop(workload: workloads.Workload, load: Load) -> tuple[Measurement, float]:
    """Operation k started at t0 + k / rate (all that are due at once when late); the
    measurement and t0."""
    schedule = Schedule()
    tasks: list[asyncio.Task[None]] = []
    total = round(load.rate * (load.warmup_s + load.seconds))
    t0 = time.perf_counter() + 0.05
    for k in range(total):
        due = t0 + k / load.rate
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        schedule.outcomes.append(Outcome(due=due))
        tasks.append(asyncio.create_task(schedule.one(workload, load.clients, k)))
    await asyncio.gather(*tasks)
    return _open_measurement(schedule, load, t0), t0


def _open_measurement(schedule: Schedule, load: Load, t0: float) -> Measurement:
    window_from, window_to = t0 + load.warmup_s, t0 + load.warmup_s + load.seconds
    measured = [o for o in schedule.outcomes if window_from <= o.due < window_to]
    finished = sum(1 for o in schedule.outcomes if o.ok and window_from <= o.ended <= window_to)
    lags = sorted(o.started - o.due for o in measured)
    measurement = summarise(
        load.workload,
        load.clients,
        load.seconds,
        [o.ended - o.due for o in measured if o.ok],
        finished,
        errors=sum(1 for o in measured if not o.ok),
        channels=load.channels,
    )
    measurement.extra = {
        "offered_rate": load.rate,
        "achieved_rate": round(finished / load.seconds, 1),
        "scheduled": len(measured),
        "start_lag_p99_ms": round(percentile(lags, 0.99) * 1000, 3),
        "max_in_flight": schedule.max_in_flight,
        "first_error": next((o.error for o in measured if o.error), ""),
    }
    return measurement


# -- this process -------------------------------------------------------------------------------


def _only_127(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"refusing to load a server that is not on 127.0.0.1: {address}")
    return address


async def generate(address: str, load: Load) -> Measurement:
    """Prepares the workload on fresh channels, runs the loop, measures it."""
    channels = [
        # A local subchannel pool gives every channel its own connection.
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(load.channels)
    ]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), timeout=workloads.RPC_TIMEOUT_S)
        workload = build(load)
        await workload.prepare(channels, load.clients)
        cpu_before, wall_before = _cpu_s(), time.perf_counter()
        if load.rate > 0:
            measurement, t0 = await open_loop(workload, load)
            window = Window(load.warmup_s, load.seconds, started=t0)
        else:
            window, failures = await closed_loop(workload, load)
            measurement = window.measurement(load.workload, load.clients, len(failures))
            measurement.channels = load.channels
            measurement.extra["first_error"] = failures[0] if failures else ""
        cpu, wall = _cpu_s() - cpu_before, time.perf_counter() - wall_before
    finally:
        for channel in channels:
            await channel.close()
    problems = workload.problems()
    measurement.errors += len(problems)
    measurement.extra["first_error"] = measurement.extra["first_error"] or "; ".join(problems)
    measurement.rpcs_per_cycle = _rpcs_per_op(workload)
    measurement.extra.update(workload.report(window))
    measurement.extra["loadgen_cpu_util"] = round(cpu / wall, 3) if wall > 0 else 0.0
    measurement.extra["loadgen_wall_s"] = round(wall, 3)
    return measurement


def _rpcs_per_op(workload: workloads.Workload) -> float:
    if isinstance(workload, workloads.Claim):  # items are rows: one call per `limit` rows
        return workload.calls / max(len(workload.claimed), 1)
    return workload.rpcs_per_op


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of the service")
    defaults = Load("noop")
    for spec in fields(Load):
        default = getattr(defaults, spec.name)
        kind = int if isinstance(default, bool) else type(default)
        parser.add_argument(f"--{spec.name.replace('_', '-')}", type=kind, default=default)
    args = parser.parse_args(argv)
    values = {spec.name: getattr(args, spec.name) for spec in fields(Load)}
    load = Load(**{**values, "request_ids": bool(values["request_ids"])})
    if problem := load.problem():
        parser.error(problem)
    measurement = asyncio.run(generate(_only_127(args.address), load))
    print(json.dumps(measurement.to_json()))
    return 0


# -- the runner's side --------------------------------------------------------------------------


class Served(Protocol):
    """A running server: what the load is aimed at and whose CPU is sampled."""

    address: str

    @property
    def pid(self) -> int: ...


def run(
    server: Served, load: Load, env: Mapping[str, str] | None = None, timeout_s: float = 0.0
) -> Measurement:
    """One load generator process against `server`, the server's CPU sampled around it
    (`server_cpu_util`: CPU seconds over the generator's busy wall time). `env`: set for
    the generator on top of this process's environment."""
    if problem := load.problem():
        raise ValueError(problem)
    before = thread_cpu(server.pid)
    done = subprocess.run(
        [sys.executable, "-m", "bench.loadgen", f"--address={server.address}", *load.arguments()],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
        timeout=timeout_s or load.warmup_s + load.seconds + 180,
    )
    spent = cpu_delta(before, thread_cpu(server.pid))
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed ({done.returncode}):\n{done.stderr[-4000:]}")
    measurement = Measurement.from_json(json.loads(done.stdout.strip().splitlines()[-1]))
    busy_s = float(measurement.extra.get("loadgen_wall_s", 0.0)) or measurement.window_s
    measurement.extra["server_cpu_util"] = round(sum(t.cpu_s for t in spent) / busy_s, 3)
    measurement.extra["server_threads"] = [
        {"name": t.name, "cpu_util": round(t.cpu_s / busy_s, 3)} for t in spent[:4]
    ]
    return measurement


if __name__ == "__main__":
    raise SystemExit(main())
