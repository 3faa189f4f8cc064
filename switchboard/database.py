"""Storage backends and the transaction runner both services sit on.

A `Backend` is the small interface that differs between SQLite and Postgres:
how to open the database, how a write transaction begins, whose clock is
"now", and whether row locks can skip rows other writers hold.

The `TransactionRunner` keeps peewee (synchronous) off the asyncio event loop:
reads run on a small thread pool, writes on dedicated writer threads that
commit whatever has queued up in one transaction (group commit), each
operation in its own savepoint. One fsync then acknowledges many calls, and a
failing operation rolls back only itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar, cast
from urllib.parse import parse_qs, unquote, urlparse

import peewee
from playhouse.pool import PooledPostgresqlDatabase

from switchboard.errors import DomainError

T = TypeVar("T")
M = TypeVar("M", bound=peewee.Model)
log = logging.getLogger(__name__)

SqliteSync = Literal["FULL", "NORMAL"]


@dataclass(frozen=True)
class DatabaseSettings:
    """How to reach and tune the database. `url` is `sqlite:///path` or `postgresql://…`."""

    url: str
    sqlite_synchronous: SqliteSync = "FULL"
    busy_timeout_ms: int = 5000
    pool_size: int = 10
    writer_threads: int = 4
    reader_threads: int = 4
    max_batch: int = 128


class Backend(Protocol):
    """What differs between SQLite and Postgres."""

    name: str
    #: Whether `SELECT … FOR UPDATE SKIP LOCKED` exists (Postgres) or writers
    #: are serialized by the database lock anyway (SQLite).
    skip_locked: bool
    writer_threads: int

    @property
    def database(self) -> peewee.Database: ...

    def write_transaction(self) -> AbstractContextManager[Any]: ...

    def now(self) -> float:
        """Seconds since the epoch on the database's clock."""
        ...


class SqliteBackend:
    name = "sqlite"
    skip_locked = False
    # SQLite has one writer at a time; a second writer thread would only wait.
    writer_threads = 1

    def __init__(self, path: str, settings: DatabaseSettings) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.database = peewee.SqliteDatabase(
            path,
            pragmas={
                "journal_mode": "wal",
                "synchronous": settings.sqlite_synchronous,
                "busy_timeout": settings.busy_timeout_ms,
                "foreign_keys": 1,
            },
            timeout=settings.busy_timeout_ms / 1000,
            returning_clause=True,
        )

    def write_transaction(self) -> AbstractContextManager[Any]:
        # IMMEDIATE takes the write lock up front, so two processes never
        # deadlock upgrading a read lock ("database is locked").
        transaction: AbstractContextManager[Any] = self.database.atomic("IMMEDIATE")
        return transaction

    def now(self) -> float:
        # SQLite has no server: the database's clock is this host's clock.
        return time.time()


class PostgresBackend:
    name = "postgres"
    skip_locked = True

    def __init__(self, url: str, settings: DatabaseSettings) -> None:
        parsed = urlparse(url)
        options = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
        self.writer_threads = settings.writer_threads
        self.database = PooledPostgresqlDatabase(
            unquote(parsed.path.lstrip("/")) or "postgres",
            user=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password else None,
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 5432,
            max_connections=settings.pool_size,
            stale_timeout=300,
            **options,
        )

    def write_transaction(self) -> AbstractContextManager[Any]:
        transaction: AbstractContextManager[Any] = self.database.atomic()
        return transaction

    def now(self) -> float:
        # The database's clock, so replicas with skewed clocks agree on leases.
        row = self.database.execute_sql("SELECT extract(epoch from clock_timestamp())").fetchone()
        return float(row[0])


def bind_model(model: type[M], database: peewee.Database) -> type[M]:
    """A subclass of `model` bound to `database`, so that several stores (two
    servers in one test process, say) never share a global binding."""
    meta = type("Meta", (), {"database": database, "table_name": model._meta.table_name})
    bound = type(model.__name__, (model,), {"Meta": meta, "__module__": model.__module__})
    return cast(type[M], bound)


def tuples(query: Any) -> list[tuple[Any, ...]]:
    """A query's rows as tuples (peewee's stubs type every row as a model)."""
    return list(query.tuples())


def dicts(query: Any) -> list[dict[str, Any]]:
    """A query's rows as dicts."""
    return list(query.dicts())


def open_backend(settings: DatabaseSettings) -> Backend:
    url = settings.url
    if url.startswith("sqlite:///"):
        return SqliteBackend(url.removeprefix("sqlite:///") or ":memory:", settings)
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresBackend(url, settings)
    raise ValueError(
        f"unsupported database URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST:PORT/DB"
    )


_STOP = object()


@dataclass
class _WriteOp:
    run: Callable[[float], Any]
    #: Settled after the commit: a concurrent future for threads, or an asyncio
    #: future together with the loop it belongs to.
    future: Future[Any] | asyncio.Future[Any]
    loop: asyncio.AbstractEventLoop | None = None


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


class TransactionRunner:
    """Runs storage operations on threads; group-commits writes."""

    def __init__(self, backend: Backend, settings: DatabaseSettings) -> None:
        self.backend = backend
        self._max_batch = settings.max_batch
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

    def submit_write(self, op: Callable[[float], T]) -> Future[T]:
        """Queue `op(now)` to run inside a write transaction; the future resolves after commit."""
        future: Future[T] = Future()
        self._queue.put(_WriteOp(op, future))
        return future

    def submit_read(self, op: Callable[[], T]) -> Future[T]:
        return self._readers.submit(self._read, op)

    async def write(self, op: Callable[[float], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put(_WriteOp(op, future, loop))
        return await future

    async def read(self, op: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit_read(op))

    def close(self) -> None:
        for _ in self._writers:
            self._queue.put(_STOP)
        for writer in self._writers:
            writer.join()
        self._readers.shutdown(wait=True)
        close_all = getattr(self.backend.database, "close_all", None)
        if close_all is not None:  # a pool: close the idle connections too
            close_all()

    # -- threads ----------------------------------------------------------------------------

    def _read(self, op: Callable[[], T]) -> T:
        self.backend.database.connect(reuse_if_open=True)
        return op()

    def _writer_loop(self) -> None:
        self.backend.database.connect(reuse_if_open=True)
        try:
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
                self._publish(batch, self._commit(batch))
                if stop_after:
                    return
        finally:
            self.backend.database.close()

    def _commit(self, batch: list[_WriteOp]) -> list[tuple[bool, Any]]:
        """Runs the batch in one transaction; returns each operation's (ok, result or error)."""
        if len(batch) == 1:
            return [self._commit_alone(batch[0])]
        try:
            with self.backend.write_transaction():
                now = self.backend.now()
                return [self._run_in_savepoint(op, now) for op in batch]
        except Exception:
            # Something broke the shared transaction: retry one by one so only
            # the operation at fault fails.
            return [self._commit_alone(op) for op in batch]

    def _commit_alone(self, op: _WriteOp) -> tuple[bool, Any]:
        try:
            with self.backend.write_transaction():
                return True, op.run(self.backend.now())
        except DomainError as refused:
            return False, refused  # rolled back: a refused call writes nothing
        except Exception as exc:
            log.exception("write transaction failed")
            return False, exc

    def _run_in_savepoint(self, op: _WriteOp, now: float) -> tuple[bool, Any]:
        try:
            with self.backend.database.atomic():
                return True, op.run(now)
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
