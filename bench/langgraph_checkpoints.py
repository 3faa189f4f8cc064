"""The section `langgraph`: `SwitchboardSaver` (LangGraph's checkpointer on a real
`switchboard serve session` process) beside LangGraph's own `SqliteSaver` and
`PostgresSaver` (in process, the `bench` extra), same payload, same run.

Each store gets threads of `steps` checkpoints (100 and 1,000), one thread per client
(1 and 8 clients, sharing one saver as the threads of a process do). Timed: the last
`reps` puts of each thread (the ones that bring it to `steps`), then `reps` reads of
its newest checkpoint (`get_tuple`, with its pending writes). Every checkpoint holds
one channel with one user message of `bench.workloads.MESSAGE_BYTES` bytes, so that a
read's cost can only grow with the thread's length, not its payload: the goal is a
`get_tuple` flat in the number of steps. SQLite stores run synchronous=FULL (the saver's
server with `--sqlite-synchronous FULL`, SqliteSaver's connection set to FULL);
Postgres ones run on fresh schemas of the same server. Under the goals, a no-op RPC's
rate on each SwitchboardSaver server at each client count (`bench.noop`) and its ratio
to the in-process saver's: the best any networked store could reach.
"""

from __future__ import annotations

import importlib.util
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import noop, servers
from bench.peers.common import EXTRA_HINT, message_content
from bench.plan import Context, Section
from bench.report import ms, rate, table
from bench.servers import Backend
from bench.stats import Measurement, summarise

CLIENTS = (1, 8)
#: The goal: get_tuple at the longest threads no slower than this times at the shortest.
FLAT_WITHIN = 1.5
#: The goal: at 8 clients, no slower than the in-process default by more than this.
SLOWER_AT_MOST = 2.0

Saver = Any  # a langgraph BaseCheckpointSaver
#: Opens a store: the saver, and the address of its server (None: in process).
Opener = Callable[[ExitStack], tuple[Saver, str | None]]


@dataclass
class Figures:
    store: str
    backend: str
    steps: int
    clients: int
    put: Measurement
    get_tuple: Measurement

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "backend": self.backend,
            "steps": self.steps,
            "clients": self.clients,
            "put": self.put.to_json(),
            "get_tuple": self.get_tuple.to_json(),
        }


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# -- the stores -----------------------------------------------------------------------------


def _switchboard(backend: Backend) -> Opener:
    def open_saver(stack: ExitStack) -> tuple[Saver, str | None]:
        from switchboard_client import SessionClient
        from switchboard_client.frameworks.langgraph import SwitchboardSaver

        server = stack.enter_context(servers.serving("session", backend))
        client = stack.enter_context(SessionClient(server.address, timeout_s=30.0))
        return SwitchboardSaver(client, agent="bench-langgraph"), server.address

    return open_saver


def _sqlite_saver(stack: ExitStack) -> tuple[Saver, str | None]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    directory = stack.enter_context(servers.temp_dir("bench-langgraph-sqlite-"))
    connection = sqlite3.connect(str(Path(directory) / "lg.sqlite3"), check_same_thread=False)
    stack.callback(connection.close)
    connection.execute("PRAGMA synchronous=FULL")
    saver = SqliteSaver(connection)
    saver.setup()
    return saver, None


def _postgres_saver(stack: ExitStack) -> tuple[Saver, str | None]:
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    url = stack.enter_context(servers.postgres_schema())
    options = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    pool = ConnectionPool(url, min_size=1, max_size=max(CLIENTS), kwargs=options, open=True)
    stack.callback(pool.close)
    saver = PostgresSaver(pool)
    saver.setup()
    return saver, None


def stores(ctx: Context) -> tuple[list[tuple[str, str, Opener]], list[str]]:
    """(store, backend label, opener) to measure, and why others are left out."""
    found: list[tuple[str, str, Opener]] = []
    notes: list[str] = []
    for key in ("sqlite-full", "postgres"):
        backend = ctx.backend(key)
        if backend is None:
            notes.append(f"langgraph on {key}: {ctx.missing(key)}")
            continue
        found.append(("SwitchboardSaver", backend.label, _switchboard(backend)))
        module, opener = (
            ("langgraph.checkpoint.postgres", _postgres_saver)
            if backend.postgres
            else ("langgraph.checkpoint.sqlite", _sqlite_saver)
        )
        peer = "PostgresSaver" if backend.postgres else "SqliteSaver"
        if _installed(module):
            found.append((peer, backend.label, opener))
        else:
            notes.append(f"langgraph {peer}: skipped ({EXTRA_HINT})")
    return found, notes


# -- the workload ---------------------------------------------------------------------------


class Chain:
    """One client's thread: puts checkpoints one after the other, each the child of the
    last."""

    def __init__(self, saver: Saver, thread_id: str, worker: int) -> None:
        self.saver = saver
        self.worker = worker
        self.config: dict[str, Any] = {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ""}
        }
        self.step = 0

    def put(self) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.step += 1
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": [message_content(self.worker, self.step)]}
        checkpoint["channel_versions"] = {"messages": self.step}
        metadata = {"source": "loop", "step": self.step, "parents": {}}
        self.config = self.saver.put(self.config, checkpoint, metadata, {"messages": self.step})
        if self.step == 1:
            # One pending write, so that every read also fetches writes.
            self.saver.put_writes(self.config, [("messages", "pending")], "task-0")

    def get_tuple(self) -> None:
        head = {"configurable": {**self.config["configurable"]}}
        head["configurable"].pop("checkpoint_id")
        if self.saver.get_tuple(head) is None:
            raise RuntimeError("the newest checkpoint was not found")


def _timed(
    chains: list[Chain], operation: Callable[[Chain], None], reps: int, name: str
) -> Measurement:
    """`reps` operations per chain, each chain in its own thread, started together."""
    latencies: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(chain: Chain) -> None:
        mine = []
        try:
            for _ in range(reps):
                began = time.perf_counter()
                operation(chain)
                mine.append(time.perf_counter() - began)
        except BaseException as exc:  # reported as the measurement's errors
            errors.append(exc)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(chain,)) for chain in chains]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    measurement = summarise(
        name, len(chains), time.perf_counter() - started, latencies, len(latencies), len(errors)
    )
    if errors:
        measurement.extra["first_error"] = repr(errors[0])
    return measurement


def measure(saver: Saver, store: str, backend: str, steps: int, clients: int, reps: int) -> Figures:
    tag = f"{store}-{steps}-{clients}-{time.monotonic_ns()}"
    chains = [Chain(saver, f"{tag}-{n}", n) for n in range(clients)]
    seeded = _timed(chains, Chain.put, steps - reps, "seed")
    if seeded.errors:
        raise RuntimeError(f"seeding failed: {seeded.extra['first_error']}")
    put = _timed(chains, Chain.put, reps, f"{store} put")
    read = _timed(chains, Chain.get_tuple, reps, f"{store} get_tuple")
    return Figures(store, backend, steps, clients, put, read)


# -- the section ----------------------------------------------------------------------------


@contextmanager
def _opened(opener: Opener) -> Iterator[tuple[Saver, str | None]]:
    with ExitStack() as stack:
        yield opener(stack)


def run(ctx: Context) -> Section:
    steps_list = ctx.scale.pick((100, 1000), (100, 1000), (10, 40))
    reps = ctx.scale.pick(100, 50, 5)
    found, notes = stores(ctx)
    figures: list[Figures] = []
    noops: dict[str, list[Measurement]] = {}
    for store, backend, opener in found:
        ctx.say(f"[langgraph] {store} on {backend}")
        with _opened(opener) as (saver, address):
            for steps in steps_list:
                for clients in CLIENTS:
                    figures.append(measure(saver, store, backend, steps, clients, reps))
            if address is not None:
                ctx.say(f"[langgraph] {noop.NAME} on {backend}")
                noops[backend] = [
                    noop.health_checks(address, clients, ctx.scale.seconds, ctx.scale.warmup_s)
                    for clients in CLIENTS
                ]
    notes += [
        f"langgraph {f.store} {f.backend} {m.name} at {f.steps} steps, {f.clients} client(s): "
        f"{m.errors} error(s), first: {m.extra.get('first_error', '')}"
        for f in figures
        for m in (f.put, f.get_tuple)
        if m.errors
    ]
    lines = _goal_lines(figures, steps_list) + _noop_lines(figures, noops)
    text = "\n\n".join([_table(figures), "\n".join(lines)])
    data = {
        "steps": list(steps_list),
        "reps": reps,
        "runs": [f.to_json() for f in figures],
        "no-op": [m.to_json() | {"backend": b} for b, found in noops.items() for m in found],
    }
    title = "LangGraph checkpointers: SwitchboardSaver vs SqliteSaver / PostgresSaver"
    return Section("langgraph", title, text, data, notes=notes)


def _table(figures: list[Figures]) -> str:
    rows = [
        [
            f.store,
            f.backend,
            str(f.steps),
            str(f.clients),
            rate(f.put.cycles_per_s),
            ms(f.put.p50_ms),
            rate(f.get_tuple.cycles_per_s),
            ms(f.get_tuple.p50_ms),
            ms(f.get_tuple.p99_ms),
        ]
        for f in figures
    ]
    header = [
        "store",
        "backend",
        "steps",
        "clients",
        "put/s",
        "put p50",
        "get/s",
        "get p50",
        "get p99",
    ]
    return table(header, rows, "ms; each thread's last puts, then reads of its newest checkpoint")


def _goal_lines(figures: list[Figures], steps_list: tuple[int, ...]) -> list[str]:
    """The issue's goals, judged on this run's figures: get_tuple flat in the steps;
    at 8 clients, within SLOWER_AT_MOST of the in-process default."""
    by = {(f.store, f.backend, f.steps, f.clients): f for f in figures}
    short, long = steps_list[0], steps_list[-1]
    lines = []
    for f in figures:
        if f.store != "SwitchboardSaver" or f.steps != long:
            continue
        base = by.get((f.store, f.backend, short, f.clients))
        if base is not None:
            growth = f.get_tuple.p50_ms / base.get_tuple.p50_ms
            verdict = "MET" if growth <= FLAT_WITHIN else "NOT MET"
            lines.append(
                f"get_tuple p50 at {long} vs {short} steps, {f.backend}, {f.clients} client(s): "
                f"{growth:.2f}x (flat: <= {FLAT_WITHIN}x) {verdict}"
            )
    for f in figures:
        if f.store == "SwitchboardSaver" or f.clients != max(CLIENTS):
            continue
        ours = by.get(("SwitchboardSaver", f.backend, f.steps, f.clients))
        if ours is None:
            continue
        for op in ("put", "get_tuple"):
            theirs_rate = getattr(f, op).cycles_per_s
            ours_rate = getattr(ours, op).cycles_per_s
            ratio = ours_rate / theirs_rate if theirs_rate > 0 else float("nan")
            verdict = "MET" if ratio >= 1 / SLOWER_AT_MOST else "NOT MET"
            lines.append(
                f"{op} at {f.steps} steps, {f.clients} clients, {f.backend}: SwitchboardSaver "
                f"{ratio:.2f}x {f.store} (>= {1 / SLOWER_AT_MOST:.1f}x) {verdict}"
            )
    return lines


def _noop_lines(figures: list[Figures], noops: dict[str, list[Measurement]]) -> list[str]:
    """Per server and client count: the no-op RPC's rate over the in-process saver's
    put and get_tuple rates (at each thread length) on the same backend."""
    lines = []
    for backend, measured in noops.items():
        defaults = [f for f in figures if f.store != "SwitchboardSaver" and f.backend == backend]
        for found in measured:
            rates = [
                (f"{f.store} {op} @{f.steps}", getattr(f, op).cycles_per_s)
                for f in defaults
                if f.clients == found.clients
                for op in ("put", "get_tuple")
            ]
            lines.append(noop.perspective(found, backend, rates))
    return lines
