"""`serve --workers N`: a parent that starts N server processes on shared ports, watches
them and stops them.

Why processes: one Python process runs its handlers under one GIL, so it uses about one
core however many threads it has. N processes bound to the same ports with SO_REUSEPORT
let the kernel spread new connections over N interpreters. Only Postgres can take writes
from several processes; SQLite keeps one writer process.

The first worker starts alone, so that a port 0 is resolved once and the others bind the
port it got (and so that one migration runs before the rest start). A worker that dies
while the others serve ends the whole command non-zero, after the others have drained:
a supervisor (systemd, Kubernetes) then restarts everything, as it would a single
process, rather than the parent hiding a crash loop.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

log = logging.getLogger(__name__)

#: What a worker sends its parent once it serves: each service's port, and the metrics
#: port (0 when metrics are off).
Ready = dict[str, int]

#: A worker's body: (its index, the listen addresses to bind, the pipe to report on).
WorkerMain = Callable[[int, Mapping[str, str], Connection], None]

#: Seconds a worker gets to drain beyond --drain-grace before it is killed.
_KILL_AFTER_GRACE_S = 15.0


class WorkersFailed(Exception):
    """A worker could not start or died; the message says which and how."""


@dataclass
class Worker:
    index: int
    process: BaseProcess
    pipe: Connection
    signalled: bool = False

    def describe(self) -> str:
        return f"worker {self.index} (pid {self.process.pid})"


def drain_when_orphaned() -> None:
    """In a worker: SIGTERM itself (a drain) once its parent is gone, even killed with
    SIGKILL, so that no worker keeps serving a port nobody supervises."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def await_parent() -> None:
        wait([parent.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=await_parent, name="parent-watch", daemon=True).start()


def _start(target: WorkerMain, index: int, listens: Mapping[str, str]) -> Worker:
    # spawn, not fork: grpc's threads and the parent's state must not be copied.
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=False)
    process = context.Process(
        target=target, args=(index, dict(listens), theirs), name=f"switchboard-worker-{index}"
    )
    process.start()
    theirs.close()
    return Worker(index, process, ours)


def _await_ready(worker: Worker, timeout_s: float) -> Ready:
    """The worker's ports once it serves; refused when it exits first or takes too long."""
    if worker.pipe.poll(timeout_s):
        try:
            ready: Ready = worker.pipe.recv()
            return ready
        except EOFError:
            pass
    worker.process.join(1.0)
    raise WorkersFailed(
        f"{worker.describe()} did not start (exit code {worker.process.exitcode}); "
        "its output above says why"
    )


class Supervisor:
    """Starts the workers, relays SIGTERM and SIGINT to them, and stops them all."""

    def __init__(self, target: WorkerMain, count: int, drain_grace_s: float) -> None:
        self.target = target
        self.count = count
        self.drain_grace_s = drain_grace_s
        self.workers: list[Worker] = []
        self._stopping = False

    def start(self, listens: Mapping[str, str], timeout_s: float) -> list[Ready]:
        """Every worker serving; the first one's ports are what the rest bind."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        try:
            first = _start(self.target, 0, listens)
            self.workers.append(first)
            readies = [_await_ready(first, timeout_s)]
            shared = {
                service: f"{address.rsplit(':', 1)[0]}:{readies[0][service]}"
                for service, address in listens.items()
            }
            rest = [_start(self.target, index, shared) for index in range(1, self.count)]
            self.workers += rest
            readies += [_await_ready(worker, timeout_s) for worker in rest]
        except WorkersFailed:
            self.stop()
            raise
        return readies

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._terminate_all()

    def _terminate_all(self) -> None:
        """SIGTERM to each worker once: a worker past its drain has given its signal
        handler back, and a second SIGTERM would kill it mid-exit."""
        self._stopping = True
        for worker in self.workers:
            if not worker.signalled and worker.process.pid is not None:
                worker.signalled = True
                _send(worker.process.pid, signal.SIGTERM)

    def watch(self) -> None:
        """Until a signal or a worker's death; a death stops the rest and is raised."""
        while not self._stopping:
            sentinels = {worker.process.sentinel: worker for worker in self.workers}
            ended = wait(list(sentinels), timeout=0.5)
            if ended and not self._stopping:
                dead = sentinels[ended[0]]  # type: ignore[index]
                self.stop()
                raise WorkersFailed(
                    f"{dead.describe()} exited with code {dead.process.exitcode}; "
                    "the other workers were drained and stopped"
                )
        self.stop()

    def stop(self) -> None:
        """SIGTERM to every worker still running (each drains), then waits; kills late ones."""
        self._terminate_all()
        for worker in self.workers:
            worker.process.join(self.drain_grace_s + _KILL_AFTER_GRACE_S)
            if worker.process.is_alive():
                log.error("%s did not drain in time: killed", worker.describe())
                worker.process.kill()
                worker.process.join()

    def clean_exit(self) -> bool:
        return all(worker.process.exitcode == 0 for worker in self.workers)


def _send(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # ended between the check and the signal
        os.kill(pid, signum)


def exit_code(supervisor: Supervisor) -> int:
    return 0 if supervisor.clean_exit() else 1
