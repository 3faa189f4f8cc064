"""What both services know of their database: settings, the `Backend` interface, opening one.

A `Backend` is the small interface that differs between SQLite
(`switchboard.sqlite_backend`) and Postgres (`switchboard.postgres_backend`):
how to open the database, how a write transaction begins, whose clock is
"now", and whether row locks can skip rows other writers hold. The threads that
run transactions are `switchboard.runner`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast

import peewee

from switchboard.errors import DomainError

M = TypeVar("M", bound=peewee.Model)

SqliteSync = Literal["FULL", "NORMAL"]
#: What SQLite start-up checks before serving: `PRAGMA quick_check` (milliseconds),
#: the full `PRAGMA integrity_check` (also every index against its table), or nothing.
IntegrityCheck = Literal["quick", "full", "off"]
#: What a replica does when the settings replicas must share differ from the ones
#: stored in the database (`switchboard.shared_settings`).
SettingsMismatch = Literal["refuse", "adopt", "overwrite"]


@dataclass(frozen=True)
class DatabaseSettings:
    """How to reach and tune the database. `url` is `sqlite:///path` or `postgresql://…`."""

    url: str
    sqlite_synchronous: SqliteSync = "FULL"
    #: How long a statement waits for a lock another connection holds before its call
    #: answers UNAVAILABLE (SQLite's busy timeout; Postgres' lock_timeout, set per
    #: transaction). A call's deadline shortens the wait: none waits past it.
    busy_timeout_ms: int = 5000
    pool_size: int = 10
    #: Postgres writer threads, each group-committing what has queued (SQLite has one
    #: writer). None: the service's own number (`session_service.app.WRITER_THREADS`,
    #: `delivery_service.app.WRITER_THREADS`); a tool that only reads or migrates uses one.
    writer_threads: int | None = None
    reader_threads: int = 4
    max_batch: int = 128
    sqlite_integrity_check: IntegrityCheck = "quick"
    on_settings_mismatch: SettingsMismatch = "refuse"
    #: SQLite `secure_delete`: deleted and overwritten content is zeroed in the file,
    #: not left in free pages (the SessionService sets it, for erasure).
    sqlite_secure_delete: bool = False


#: Statements that only begin or end a transaction or a savepoint: not counted as
#: work, since how they travel differs between the backends (Postgres defers them).
_TRANSACTION_CONTROL = ("BEGIN", "SAVEPOINT", "RELEASE", "COMMIT", "ROLLBACK", "END")


class StatementCounter:
    """Counts the SQL statements a backend's code sends, so that tests and benchmarks can
    hold a call to a number of statements, counted the same way on both backends.

    Each backend's database notes every statement given to `execute_sql` and every
    write deferred with `Backend.execute_later` (on Postgres it travels inside the
    next statement, but it is still one statement of work); transaction control
    (BEGIN, SAVEPOINT, RELEASE, COMMIT, ROLLBACK) and the Postgres clock sample are
    not counted. Off (one attribute check per statement) until `counting()`."""

    def __init__(self) -> None:
        self._on = 0
        self._lock = threading.Lock()
        self._statements: list[str] = []
        self._paused = threading.local()

    def note(self, sql: str) -> None:
        paused: int = getattr(self._paused, "depth", 0)
        if not self._on or paused:
            return
        if sql.lstrip().split(" ", 1)[0].upper() in _TRANSACTION_CONTROL:
            return
        with self._lock:
            self._statements.append(sql)

    @contextmanager
    def counting(self) -> Iterator[list[str]]:
        """The statements sent while the block runs (by every thread), in order."""
        with self._lock:
            self._on += 1
            self._statements = []
        try:
            yield self._statements
        finally:
            with self._lock:
                self._on -= 1

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Statements this thread sends in the block are bookkeeping of the backend
        itself (the clock sample), not work of the call being counted."""
        self._paused.depth = getattr(self._paused, "depth", 0) + 1
        try:
            yield
        finally:
            self._paused.depth -= 1


class StartupRefused(Exception):
    """The database must not be served (damaged, or its stored settings disagree):
    the process says why and exits non-zero instead of starting."""


class Backend(Protocol):
    """What differs between SQLite and Postgres."""

    name: str
    #: Whether `SELECT … FOR UPDATE SKIP LOCKED` exists (Postgres) or writers
    #: are serialized by the database lock anyway (SQLite).
    skip_locked: bool
    writer_threads: int
    #: Appended to a SELECT to lock the rows it reads until the transaction ends:
    #: " FOR UPDATE" on Postgres; empty on SQLite, whose IMMEDIATE transactions
    #: hold the database's one write lock already.
    for_update: str
    #: An SQL expression of one integer parameter that tries to take a lock on it
    #: until the transaction ends, without waiting, and is true when it did: Postgres'
    #: `pg_try_advisory_xact_lock`; always true on SQLite, whose writers take turns.
    try_lock_sql: str
    #: Counts the statements sent through this backend (see `StatementCounter`).
    statements: StatementCounter

    def octet_length(self, column: Any) -> Any:
        """SQL for a text column's length in bytes (SQLite's LENGTH counts characters)."""
        ...

    def sql(self, text: str) -> str:
        """`text`, a statement written with `?` placeholders, in this backend's
        parameter style: the one place a statement's dialect is handled."""
        ...

    @property
    def database(self) -> peewee.Database: ...

    def write_transaction(self) -> AbstractContextManager[Any]: ...

    def read_snapshot(self) -> AbstractContextManager[Any]:
        """A read-only transaction whose statements all see one committed state: for
        reads of several statements (a snapshot and the events after it, say), which a
        commit between two of them must not tear."""
        ...

    def migration_lock(self, key: int) -> AbstractContextManager[Any]:
        """A write transaction that first takes the schema lock `key` (one per
        component), held until it ends: concurrent starters wait, then see the
        schema as the first one left it."""
        ...

    def now(self) -> float:
        """Seconds since the epoch on the database's clock."""
        ...

    def execute_later(self, sql: str, params: Sequence[Any]) -> None:
        """Runs a write whose answer nobody reads, in the current transaction: on
        Postgres it travels with the transaction's next statement (or its COMMIT)
        instead of costing a round trip of its own; later statements see it, as they
        would have. Outside a transaction it runs at once."""
        ...

    def notify(self, channel: str) -> None:
        """Announces `channel` when the current transaction commits (Postgres NOTIFY,
        sent with the transaction's next statement); nothing on SQLite."""
        ...

    def listen(self, channel: str, announced: Callable[[], None]) -> Callable[[], None] | None:
        """Calls `announced` (from a thread of its own) after commits that notified
        `channel`, and after each (re)connection of its listening connection, which it
        keeps up through database faults; returns the function that stops it. None
        where there is no such thing (SQLite: other processes are found by polling)."""
        ...

    def probe(self) -> None:
        """Raises `switchboard.errors.Unavailable` when the database cannot serve
        calls now (what health checking reports); returns quickly either way."""
        ...

    def probe_writes(self, tables: Sequence[str], wait_s: float) -> None:
        """Raises `switchboard.errors.TimedOut` when a write to `tables` could not take
        its locks within `wait_s` (another connection holds them: a `LOCK TABLE`, a long
        migration, SQLite's write lock held by another process); takes nothing for long."""
        ...

    def bound_lock_waits(self, seconds: float) -> AbstractContextManager[None]:
        """While the block runs, statements of this thread wait at most `seconds` for a
        lock another connection holds, then fail with what `translate` makes `TimedOut`."""
        ...

    def translate(self, exc: BaseException) -> DomainError | None:
        """The domain error a database fault means (UNAVAILABLE, RESOURCE_EXHAUSTED),
        or None when `exc` is no fault of the database (a bug: INTERNAL). A lost connection
        is `ConnectionLost`, which the runner retries once on a fresh connection."""
        ...


def bind_model(model: type[M], database: peewee.Database, table_name: str = "") -> type[M]:
    """A subclass of `model` bound to `database` (and to `table_name`, when given),
    so that several stores (two servers in one test process, say) never share a
    global binding."""
    name = table_name or model._meta.table_name
    meta = type("Meta", (), {"database": database, "table_name": name})
    bound = type(model.__name__, (model,), {"Meta": meta, "__module__": model.__module__})
    return cast(type[M], bound)


def tuples(query: Any) -> list[tuple[Any, ...]]:
    """A query's rows as tuples (peewee's stubs type every row as a model)."""
    return list(query.tuples())


def dicts(query: Any) -> list[dict[str, Any]]:
    """A query's rows as dicts."""
    return list(query.dicts())
