"""The transaction runner both services sit on.

The `TransactionRunner` keeps peewee (synchronous) off the asyncio event loop:
reads run on a small thread pool, writes on dedicated writer threads that
commit whatever has queued up in one transaction (group commit), each
operation in its own savepoint. One fsync then acknowledges many calls, and a
failing operation rolls back only itself.

Database faults: every read and every transaction takes a connection from the
backend's pool and gives it back after, so a broken connection (a server
restart, a terminated backend) is discarded and the next call gets a fresh
one. A call that loses its connection answers UNAVAILABLE: a read, or a write
whose transaction broke before COMMIT (it wrote nothing), is first retried once
on a fresh connection; a write that broke during COMMIT cannot know whether it
committed and answers UNAVAILABLE at once (a retry with the same request id is
safe). When a connection cannot be made, the database counts as down for a short
window in which calls fail at once instead of each waiting for a connect
timeout; `probe()` (health checking) ends the window when the database answers.

A write may carry its call's request id (`write(op, guard)`, see
`switchboard.idempotency`): the op then runs under the guard in the same
transaction, which stores the call's answer with the write or replays a stored one.

Each operation runs in the `contextvars` context of the call that submitted it
(per-call values set by interceptors are visible inside), and an operation whose
caller's deadline (`switchboard.deadlines.CALL_DEADLINE`) passed while it queued
is not executed: it is settled DEADLINE_EXCEEDED.

Locks: a statement waits for a lock another connection holds (a `LOCK TABLE`, a
migration, another process's SQLite write lock) at most `DatabaseSettings.busy_timeout_ms`
(--db-lock-timeout), and never past its caller's deadline (a group commit: the latest
of its callers'). Then the call answers UNAVAILABLE (`TimedOut`), or DEADLINE_EXCEEDED
when its deadline has passed, with one warning line at most (budgeted, not a
traceback); so does a statement the database cancelled (statement_timeout). `probe()`
also tries to take the locks a write needs, so that health checking reports a database
whose tables stay locked as one that cannot serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from playhouse.pool import PooledDatabase

from switchboard.database import Backend, DatabaseSettings
from switchboard.deadlines import CALL_DEADLINE
from switchboard.errors import (
    ConnectionLost,
    DeadlineExceeded,
    DomainError,
    TimedOut,
    Unavailable,
)
from switchboard.idempotency import RequestGuard
from switchboard.log_budget import LogBudget

T = TypeVar("T")
log = logging.getLogger(__name__)

#: After a failed connect, calls fail at once for this long (seconds) rather than
#: each waiting for its own connect timeout; a successful probe ends it sooner.
DOWN_WINDOW_S = 1.0
#: How long `probe()` waits for the locks a write takes (at most the lock bound) before
#: the database counts as one that cannot serve: long enough that a lock taken for a
#: moment (a fast migration, autovacuum truncating a table) does not count.
PROBE_LOCK_WAIT_S = 1.0

_STOP = object()


@dataclass
class _WriteOp:
    run: Callable[[float], Any]
    #: Settled after the commit: a concurrent future for threads, or an asyncio
    #: future together with the loop it belongs to.
    future: Future[Any] | asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop | None = None
    #: The submitting call's context and deadline, captured when it was queued.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    deadline: float | None = field(default_factory=CALL_DEADLINE.get)

    def call(self, now: float) -> Any:
        return self.context.run(self.run, now)


def _guarded(op: Callable[[float], T], guard: RequestGuard | None) -> Callable[[float], T]:
    """`op` under its call's request-id guard, when it carries one."""
    return op if guard is None else guard.guarding(op)


def _settle(future: Future[Any] | asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.cancelled():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _settle_all(outcomes: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for future, ok, value in outcomes:
        _settle(future, ok, value)


def _answer_to(caller_deadline: float | None, gave_up: TimedOut) -> DomainError:
    """DEADLINE_EXCEEDED when the caller's deadline ended the wait, else `gave_up`."""
    if caller_deadline is not None and time.monotonic() >= caller_deadline:
        return DeadlineExceeded(
            "DEADLINE_EXCEEDED",
            f"the call's deadline passed while it waited for the database: {gave_up.message}",
        )
    return gave_up


def _expired(deadline: float | None) -> DeadlineExceeded | None:
    if deadline is not None and time.monotonic() >= deadline:
        return DeadlineExceeded(
            "DEADLINE_EXCEEDED", "the call's deadline passed before its turn; it was not executed"
        )
    return None


class _Outage:
    """Whether the database could not be reached a moment ago (see `DOWN_WINDOW_S`)."""

    def __init__(self) -> None:
        self._until = 0.0
        self._error: Unavailable | None = None

    def error(self) -> Unavailable | None:
        return self._error if time.monotonic() < self._until else None

    def down(self, error: Unavailable) -> None:
        self._error = error
        self._until = time.monotonic() + DOWN_WINDOW_S

    def up(self) -> None:
        self._until = 0.0


class _LostAtCommit(Exception):
    """The connection broke while COMMIT was under way: the outcome is unknown."""


class TransactionRunner:
    """Runs storage operations on threads; group-commits writes."""

    def __init__(
        self,
        backend: Backend,
        settings: DatabaseSettings,
        begin_write: Callable[[], None] | None = None,
        written_tables: Sequence[str] = (),
    ) -> None:
        """`begin_write` runs first in every write transaction: the place a service
        takes the lock its version checks rely on (see `EventLog.lock_log`).
        `written_tables`: the tables the service writes, whose locks `probe()` tries."""
        self.backend = backend
        self._begin_write = begin_write or (lambda: None)
        self._written_tables = tuple(written_tables)
        self._max_lock_wait_s = settings.busy_timeout_ms / 1000
        self._gave_up_lines = LogBudget()
        #: Write transactions committed so far (health checking tells progress by it).
        self._commits = 0
        self._max_batch = settings.max_batch
        self._pooled = isinstance(backend.database, PooledDatabase)
        self._outage = _Outage()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._readers = ThreadPoolExecutor(
            max_workers=settings.reader_threads, thread_name_prefix=f"{backend.name}-reader"
        )
        self._writers = [
            threading.Thread(
                target=self._writer_loop, name=f"{backend.name}-writer-{i}", daemon=True
            )
            for i in range(backend.writer_threads)
        ]
        for writer in self._writers:
            writer.start()

    # -- submission -----------------------------------------------------------------------

    def submit_write(
        self, op: Callable[[float], T], guard: RequestGuard | None = None
    ) -> Future[T]:
        """Queue `op(now)` to run inside a write transaction; the future resolves after
        commit. `guard`: the call's request id, when this is the call's first write."""
        future: Future[T] = Future()
        self._enqueue(_WriteOp(_guarded(op, guard), future))
        return future

    def submit_read(self, op: Callable[[], T], consistent: bool = False) -> Future[T]:
        """`consistent`: run `op` in one read snapshot (`Backend.read_snapshot`), for
        reads of several statements that a concurrent commit must not tear."""
        context, deadline = contextvars.copy_context(), CALL_DEADLINE.get()
        return self._readers.submit(self._read, op, context, deadline, consistent)

    async def write(self, op: Callable[[float], T], guard: RequestGuard | None = None) -> T:
        """`submit_write` for a coroutine."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._enqueue(_WriteOp(_guarded(op, guard), future, loop))
        return await future

    async def read(self, op: Callable[[], T], consistent: bool = False) -> T:
        return await asyncio.wrap_future(self.submit_read(op, consistent))

    def probe(self) -> None:
        """Raises `Unavailable` unless the database answers now and a write could take
        its locks (health checking).

        A failure to answer opens the outage window (calls fail fast); success closes it.
        Locks held elsewhere do not: calls keep trying, each within its own bound.
        """
        try:
            self._probe_once()
        except ConnectionLost:
            self._discard_connection()  # a pooled connection was stale: try a fresh one
            try:
                self._probe_once()
            except Unavailable as down:
                self._outage.down(down)
                raise
        except Unavailable as down:
            self._outage.down(down)
            raise
        self._outage.up()
        self._probe_writes()

    def _probe_writes(self) -> None:
        """Raises `TimedOut` when a write could not take the written tables' locks within
        `PROBE_LOCK_WAIT_S` and no write of this runner committed meanwhile: this
        process's own writers, taking SQLite's one write lock in turn, hold nobody up."""
        commits = self._commits
        try:
            wait_s = min(PROBE_LOCK_WAIT_S, self._max_lock_wait_s)
            self.backend.probe_writes(self._written_tables, wait_s)
        except TimedOut:
            if self._commits == commits:
                raise

    def _probe_once(self) -> None:
        try:
            self.backend.probe()
        except DomainError:
            raise
        except Exception as exc:
            raise self._translated(exc) or Unavailable(
                "DATABASE_UNAVAILABLE", f"the database probe failed: {exc}"
            ) from exc

    def close(self) -> None:
        for _ in self._writers:
            self._queue.put(_STOP)
        for writer in self._writers:
            writer.join()
        self._readers.shutdown(wait=True)
        close_all = getattr(self.backend.database, "close_all", None)
        if close_all is not None:  # a pool: close the idle connections too
            close_all()

    def _enqueue(self, op: _WriteOp) -> None:
        down = self._outage.error()
        if down is not None:
            _settle(op.future, False, down)  # fail fast: the database is unreachable
        else:
            self._queue.put(op)

    # -- connections ------------------------------------------------------------------------

    def _translated(self, exc: Exception) -> DomainError | None:
        return self.backend.translate(exc)

    @contextlib.contextmanager
    def _connected(self) -> Iterator[None]:
        """A connection for one read or one transaction: from the pool, and back after."""
        down = self._outage.error()
        if down is not None:
            raise down
        database = self.backend.database
        try:
            database.connect(reuse_if_open=True)
        except Exception as exc:
            fault = self._translated(exc)
            if not isinstance(fault, Unavailable):
                raise
            unreachable = Unavailable(
                "DATABASE_UNREACHABLE",
                f"the database cannot be reached ({fault.message}); "
                "the call wrote nothing and may be retried",
            )
            self._outage.down(unreachable)
            raise unreachable from exc
        try:
            yield
        except BaseException as exc:
            if isinstance(exc, _LostAtCommit | ConnectionLost) or (
                isinstance(exc, Exception) and isinstance(self._translated(exc), ConnectionLost)
            ):
                self._discard_connection()
            raise
        finally:
            if self._pooled:
                with contextlib.suppress(Exception):
                    database.close()  # back to the pool (a broken one is dropped)

    def _bounded(self, deadlines: Sequence[float | None]) -> contextlib.AbstractContextManager[Any]:
        """Lock waits bounded by the configured wait, or sooner by the callers' deadlines
        (the latest: no caller of a group commit is failed before its own deadline)."""
        wait_s = self._max_lock_wait_s
        if deadlines and None not in deadlines:
            latest = max(deadline for deadline in deadlines if deadline is not None)
            wait_s = min(wait_s, latest - time.monotonic())
        return self.backend.bound_lock_waits(max(wait_s, 0.001))

    def _gave_up(self, gave_up: TimedOut, deadlines: Sequence[float | None]) -> list[DomainError]:
        """Each caller's answer for an operation whose statement gave up waiting; the
        event is logged in one line, within a budget (a held lock fails every call)."""
        held = self._gave_up_lines.take()
        if held is not None:
            note = f" ({held} more since, not logged)" if held else ""
            log.warning(
                "a call gave up on the database (%s): %s%s", gave_up.reason, gave_up.message, note
            )
        return [_answer_to(deadline, gave_up) for deadline in deadlines]

    def _discard_connection(self) -> None:
        """Drops this thread's connection, and the pool's idle ones: a server that broke
        one connection (a restart, a mass termination) has usually broken them all."""
        database: Any = self.backend.database
        with contextlib.suppress(Exception):
            if self._pooled:
                database.manual_close()
                database.close_idle()
            else:
                database.close()

    # -- reads ------------------------------------------------------------------------------

    def _read(
        self,
        op: Callable[[], T],
        context: contextvars.Context,
        deadline: float | None,
        consistent: bool = False,
    ) -> T:
        for attempt in (1, 2):
            expired = _expired(deadline)
            if expired is not None:
                raise expired
            try:
                with self._connected(), self._bounded([deadline]), self._snapshot(consistent):
                    return context.run(op)
            except DomainError:
                raise
            except Exception as exc:
                fault = self._translated(exc)
                if fault is None:
                    raise
                if isinstance(fault, TimedOut):
                    raise self._gave_up(fault, [deadline])[0] from exc
                if attempt == 2 or not isinstance(fault, ConnectionLost):
                    raise fault from exc
                log.warning("a read lost its database connection (%s); retrying once", exc)
        raise AssertionError("unreachable")

    def _snapshot(self, consistent: bool) -> contextlib.AbstractContextManager[Any]:
        return self.backend.read_snapshot() if consistent else contextlib.nullcontext()

    # -- writes -----------------------------------------------------------------------------

    def _writer_loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[_WriteOp] = [first]
            stop_after = False
            while len(batch) < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stop_after = True
                    break
                batch.append(item)
            self._publish(batch, self._outcomes(batch))
            if stop_after:
                return

    def _outcomes(self, batch: list[_WriteOp]) -> list[tuple[bool, Any]]:
        """Each operation's (ok, result or error): expired ones are not executed."""
        outcomes: list[tuple[bool, Any] | None] = []
        live: list[_WriteOp] = []
        for op in batch:
            expired = _expired(op.deadline)
            outcomes.append(None if expired is None else (False, expired))
            if expired is None:
                live.append(op)
        committed = iter(self._commit(live) if live else [])
        return [outcome or next(committed) for outcome in outcomes]

    def _commit(self, batch: list[_WriteOp]) -> list[tuple[bool, Any]]:
        """Runs the batch in one transaction; returns each operation's (ok, result or error)."""
        if len(batch) == 1:
            return [self._commit_alone(batch[0])]
        deadlines = [op.deadline for op in batch]
        try:
            return self._transaction(
                lambda now: [self._run_in_savepoint(op, now) for op in batch], deadlines
            )
        except ConnectionLost:
            # Broke before COMMIT: nothing was written, so each may run again.
            return [self._commit_alone(op) for op in batch]
        except _LostAtCommit:
            return [(False, self._lost_at_commit())] * len(batch)
        except TimedOut as gave_up:  # alone, each would wait as long again
            return [(False, answer) for answer in self._gave_up(gave_up, deadlines)]
        except Unavailable as unreachable:  # none of them ran
            return [(False, unreachable)] * len(batch)
        except Exception:
            # Something broke the shared transaction: retry one by one so only
            # the operation at fault fails.
            return [self._commit_alone(op) for op in batch]

    def _commit_alone(self, op: _WriteOp) -> tuple[bool, Any]:
        for attempt in (1, 2):
            expired = _expired(op.deadline)
            if expired is not None:
                return False, expired
            try:
                return True, self._transaction(op.call, [op.deadline])
            except ConnectionLost as lost:
                if attempt == 2:
                    return False, lost
                log.warning("a write lost its database connection before COMMIT; retrying once")
            except TimedOut as gave_up:
                return False, self._gave_up(gave_up, [op.deadline])[0]
            except DomainError as refused:
                return False, refused  # rolled back: a refused call writes nothing
            except _LostAtCommit:
                return False, self._lost_at_commit()
            except Exception as exc:
                log.exception("write transaction failed")
                return False, exc
        raise AssertionError("unreachable")

    def _transaction(self, body: Callable[[float], T], deadlines: Sequence[float | None]) -> T:
        """`body(now)` in one write transaction on a pooled connection, its lock waits
        bounded for the callers whose `deadlines` are given.

        Raises `ConnectionLost` if the connection broke before COMMIT, `_LostAtCommit`
        if it broke during COMMIT, and the backend's translation of known faults.
        """
        committing = False
        try:
            with self._connected(), self._bounded(deadlines), self.backend.write_transaction():
                self._begin_write()
                result = body(self.backend.now())
                committing = True
            self._commits += 1
            return result
        except DomainError:
            raise
        except Exception as exc:
            fault = self._translated(exc)
            if committing and isinstance(fault, ConnectionLost):
                raise _LostAtCommit() from exc
            if fault is None:
                raise
            raise fault from exc

    @staticmethod
    def _lost_at_commit() -> Unavailable:
        log.warning("the database connection was lost during COMMIT; the outcome is unknown")
        return Unavailable(
            "DATABASE_CONNECTION_LOST",
            "the database connection was lost while the call committed: it may or may not "
            "have been applied; retry it with the same request id",
        )

    def _run_in_savepoint(self, op: _WriteOp, now: float) -> tuple[bool, Any]:
        try:
            with self.backend.database.atomic():
                return True, op.call(now)
        except DomainError as refused:
            return False, refused

    def _publish(self, batch: list[_WriteOp], outcomes: list[tuple[bool, Any]]) -> None:
        """Settles the futures, waking each event loop once per batch, not once per call."""
        per_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
        for op, (ok, value) in zip(batch, outcomes, strict=True):
            if op.loop is None:
                _settle(op.future, ok, value)
            else:
                per_loop.setdefault(op.loop, []).append((op.future, ok, value))  # type: ignore[arg-type]
        for loop, settled in per_loop.items():
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody awaits these
                loop.call_soon_threadsafe(_settle_all, settled)
