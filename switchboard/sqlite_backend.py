"""The SQLite backend: one file, WAL, one writer at a time.

Besides opening the file, the backend guards it:
- start-up refuses a damaged file (`PRAGMA quick_check`, or the full
  `integrity_check` behind `DatabaseSettings.sqlite_integrity_check`);
- a file deleted or replaced under the running server is noticed (its device
  and inode are compared with the ones seen at open before every transaction,
  every statement outside one, and after every commit): calls are then refused
  with UNAVAILABLE and `probe()` fails, instead of acknowledging writes into an
  unlinked inode that the next start would not find;
- database faults become domain errors (`translate`): a full disk is
  RESOURCE_EXHAUSTED, a lock held past the busy timeout (`TimedOut`) or an I/O
  error is UNAVAILABLE, each message naming the file;
- "now" is a clock anchored in the file that wall-clock steps do not move
  (`switchboard.sqlite_clock`).
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import peewee

from switchboard.database import (
    DatabaseSettings,
    IntegrityCheck,
    StartupRefused,
    StatementCounter,
)
from switchboard.errors import DomainError, ResourceExhausted, TimedOut, Unavailable
from switchboard.sqlite_clock import AnchoredClock, WallClock, anchored_clock

log = logging.getLogger(__name__)

#: How often the same database fault is logged again while it lasts.
FAULT_LOG_EVERY_S = 60.0
#: Problems `PRAGMA quick_check` / `integrity_check` report at most.
CHECK_REPORT_LINES = 10


class SqliteBackend:
    name = "sqlite"
    try_lock_sql = "(? IS NOT NULL)"
    for_update = ""
    skip_locked = False
    # SQLite has one writer at a time; a second writer thread would only wait.
    writer_threads = 1

    def octet_length(self, column: Any) -> Any:
        return peewee.fn.LENGTH(column.cast("BLOB"))

    def sql(self, text: str) -> str:
        return text  # sqlite3's parameter style is `?` already

    def __init__(self, path: str, settings: DatabaseSettings) -> None:
        self.path = path
        self.busy_timeout_ms = settings.busy_timeout_ms
        #: Per thread: the busy timeout `bound_lock_waits` last set on its connection.
        self._bound = threading.local()
        self.file = DataFile(path)
        self._faults = _FaultLog()
        #: Set when a statement met a damaged page: health stops answering SERVING.
        self._damage: str | None = None
        self.statements = StatementCounter()
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            if not Path(path).exists():
                log.warning("no SQLite database at %s: creating a new, empty one", path)
        self.database = _GuardedDatabase(
            path,
            self.file,
            self.statements,
            pragmas={
                "journal_mode": "wal",
                "synchronous": settings.sqlite_synchronous,
                "busy_timeout": settings.busy_timeout_ms,
                "foreign_keys": 1,
                "secure_delete": int(settings.sqlite_secure_delete),
            },
            timeout=settings.busy_timeout_ms / 1000,
            returning_clause=True,
        )
        self.clock: AnchoredClock | WallClock = WallClock()
        if path != ":memory:":
            self._open(settings.sqlite_integrity_check)

    def _open(self, check: IntegrityCheck) -> None:
        """Creates the file if needed, checks it, remembers it, and anchors the clock."""
        try:
            with self.database.connection_context():
                self.file.remember()
                self._check_integrity(check)
                self.clock = anchored_clock(self.database, self.path)
        except (peewee.DatabaseError, sqlite3.DatabaseError) as exc:
            fault = self.translate(exc)
            raise StartupRefused(
                f"cannot open the SQLite database {self.path}: {fault.message if fault else exc}"
            ) from exc

    def _check_integrity(self, check: IntegrityCheck) -> None:
        if check == "off":
            return
        pragma = "quick_check" if check == "quick" else "integrity_check"
        started = time.perf_counter()
        try:
            rows = self.database.execute_sql(f"PRAGMA {pragma}({CHECK_REPORT_LINES})")
            problems = [str(row[0]) for row in rows.fetchall()]
        # Rows are fetched outside peewee's wrapper: sqlite3's own error may come instead.
        except (peewee.DatabaseError, sqlite3.DatabaseError) as exc:
            fault = self.translate(exc)
            if fault is None or fault.reason != "DATABASE_DAMAGED":
                raise
            problems = [str(exc)]  # too damaged for the check to finish
        if problems != ["ok"]:
            raise StartupRefused(
                f"the SQLite database {self.path} is damaged; PRAGMA {pragma} found:\n  "
                + "\n  ".join(problems)
                + f"\nrefusing to serve it: restore the file from a backup, or salvage "
                f"what is readable with `sqlite3 {self.path} .recover`"
            )
        log.info(
            "PRAGMA %s of %s: ok in %.0f ms",
            pragma,
            self.path,
            (time.perf_counter() - started) * 1000,
        )

    # -- the Backend interface --------------------------------------------------------------

    def write_transaction(self) -> AbstractContextManager[Any]:
        return self._write_transaction()

    @contextmanager
    def _write_transaction(self) -> Iterator[Any]:
        # IMMEDIATE takes the write lock up front, so two processes never
        # deadlock upgrading a read lock ("database is locked").
        with self.database.atomic("IMMEDIATE") as transaction:
            yield transaction
        # A commit into a file that was deleted or replaced meanwhile is lost:
        # say so instead of acknowledging it.
        self.file.check()

    def read_snapshot(self) -> AbstractContextManager[Any]:
        # A deferred transaction reads one WAL snapshot from its first statement on,
        # and takes no write lock.
        transaction: AbstractContextManager[Any] = self.database.atomic("DEFERRED")
        return transaction

    def migration_lock(self, key: int) -> AbstractContextManager[Any]:
        # The file has one write lock; IMMEDIATE takes it before the first read.
        del key
        return self.write_transaction()

    def now(self) -> float:
        return self.clock.now()

    def execute_later(self, sql: str, params: Sequence[Any]) -> None:
        # No round trips to save: a local file.
        database: Any = self.database
        database.execute_sql(sql, params)

    def notify(self, channel: str) -> None:
        pass  # one process's watchers are woken by its own commits

    def listen(self, channel: str, announced: Callable[[], None]) -> Callable[[], None] | None:
        return None

    def probe(self) -> None:
        self.file.check()
        if self._damage is not None:
            raise Unavailable("DATABASE_DAMAGED", self._damage)
        if self.path == ":memory:":
            return
        # A connection of its own (never creating the file): a read of the
        # header, so that an unreadable file fails here too.
        try:
            with closing(self.file.connect_existing(timeout_s=1.0)) as connection:
                connection.execute("PRAGMA schema_version").fetchone()
        except sqlite3.Error as exc:
            # The file may have gone between the check above and the open: say so,
            # not "cannot be opened" (which would open the runner's outage window).
            self.file.check()
            fault = self.translate(exc)
            raise Unavailable(
                fault.reason if fault else "DATABASE_UNAVAILABLE",
                fault.message if fault else f"the SQLite database {self.path} failed: {exc}",
            ) from exc

    def probe_writes(self, tables: Sequence[str], wait_s: float) -> None:
        # The file has one write lock, whatever the tables: take it (as every write
        # transaction does, IMMEDIATE) on a connection of its own, and let it go.
        del tables
        if self.path == ":memory:":
            return
        try:
            with closing(self.file.connect_existing(timeout_s=wait_s)) as connection:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("ROLLBACK")
        except sqlite3.Error as exc:
            fault = self.translate(exc)
            if fault is None:
                raise
            raise fault from exc

    @contextmanager
    def bound_lock_waits(self, seconds: float) -> Iterator[None]:
        # Rounded up: a bound taken from a deadline ends at or after it, never before.
        busy_ms = max(1, math.ceil(seconds * 1000))
        database: Any = self.database  # peewee's stubs leave connection() untyped
        connection: sqlite3.Connection = database.connection()
        if getattr(self._bound, "set_on", None) is not connection or self._bound.ms != busy_ms:
            connection.execute(f"PRAGMA busy_timeout = {busy_ms}")  # bookkeeping: uncounted
            self._bound.set_on, self._bound.ms = connection, busy_ms
        # Left set after the block: each operation of the runner's threads (the only
        # users of their connections) sets its own first.
        yield

    def _busy_timeout_ms(self) -> int:
        """The busy timeout of this thread's connection (translated faults say it)."""
        busy_ms: int = getattr(self._bound, "ms", self.busy_timeout_ms)
        return busy_ms

    def translate(self, exc: BaseException) -> DomainError | None:
        for link in _causes(exc):
            if isinstance(link, DomainError):
                return link  # a check of ours, raised inside peewee
            fault = self._fault(link) if isinstance(link, sqlite3.Error) else None
            if fault is not None:
                if not isinstance(fault, TimedOut):  # the runner logs those, budgeted
                    self._faults.note(fault)
                return fault
        return None

    # -- faults --------------------------------------------------------------------------

    def _fault(self, error: sqlite3.Error) -> DomainError | None:
        code = getattr(error, "sqlite_errorcode", None)
        name = getattr(error, "sqlite_errorname", "") or str(error)
        if code is None:
            return None
        primary = code & 0xFF
        path = self.path
        if primary == sqlite3.SQLITE_FULL:
            return ResourceExhausted(
                "DATABASE_DISK_FULL",
                f"the disk holding the SQLite database {path} is full: free space there; "
                "the call wrote nothing and can be retried once space is free",
            )
        if primary in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return TimedOut(
                "DATABASE_LOCKED",
                f"the SQLite database {path} stayed locked by another connection for longer "
                f"than the busy timeout ({self._busy_timeout_ms()} ms: the call's deadline or "
                "--db-lock-timeout); the call wrote nothing: retry. `fuser` or `lsof` on "
                "the file shows which process holds it",
            )
        if primary == sqlite3.SQLITE_NOMEM:
            return ResourceExhausted(
                "OUT_OF_MEMORY", f"SQLite ran out of memory working on {path}: retry later"
            )
        if primary in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            self._damage = (
                f"the SQLite database {path} is damaged ({name}: {error}); "
                "stop the service and restore the file from a backup"
            )
            return Unavailable("DATABASE_DAMAGED", self._damage)
        plain = {
            sqlite3.SQLITE_IOERR: ("DATABASE_IO_ERROR", "an I/O error"),
            sqlite3.SQLITE_CANTOPEN: ("DATABASE_UNREACHABLE", "cannot be opened"),
            sqlite3.SQLITE_READONLY: ("DATABASE_READ_ONLY", "cannot be written"),
            sqlite3.SQLITE_PROTOCOL: ("DATABASE_LOCKED", "a locking protocol error"),
        }
        if primary in plain:
            reason, what = plain[primary]
            return Unavailable(reason, f"the SQLite database {path}: {what} ({name}); retry")
        return None


class DataFile:
    """The database file as the backend opened it: (device, inode) remembered at open.

    A file deleted under a running server would keep taking writes into its
    unlinked inode (lost at the next start); a file replaced would be split
    between connections opened before and after. Either way every call is
    refused from the moment it is noticed, and the error is logged once.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._identity: tuple[int, int] | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()

    def remember(self) -> None:
        info = os.stat(self.path)
        self._identity = (info.st_dev, info.st_ino)

    @property
    def opened(self) -> bool:
        return self._identity is not None

    def check(self) -> None:
        """Raises `Unavailable` when the file at the path is not the one opened."""
        if self._lost is None and self._identity is not None:
            try:
                info = os.stat(self.path)
            except FileNotFoundError:
                self._mark_lost("was deleted")
            else:
                if (info.st_dev, info.st_ino) != self._identity:
                    self._mark_lost("was replaced by another file")
        if self._lost is not None:
            raise Unavailable("DATABASE_FILE_LOST", self._lost)

    def _mark_lost(self, what: str) -> None:
        with self._lock:
            if self._lost is not None:
                return
            self._lost = (
                f"the SQLite database {self.path} {what} while this server had it open; "
                "refusing every call (writes would be lost): restore the file and restart"
            )
        log.error("%s", self._lost)

    def connect_existing(self, timeout_s: float) -> sqlite3.Connection:
        """A connection to the file at the path that never creates one."""
        return sqlite3.connect(
            f"file:{quote(self.path)}?mode=rw", uri=True, timeout=timeout_s, isolation_level=None
        )


class _GuardedDatabase(peewee.SqliteDatabase):
    """peewee's SQLite database with the file checked before each transaction and
    each statement outside one; connections after the first never create the file."""

    def __init__(
        self, path: str, file: DataFile, statements: StatementCounter, **kwargs: Any
    ) -> None:
        super().__init__(path, **kwargs)
        self._file = file
        self.statements = statements

    def _connect(self) -> sqlite3.Connection:
        peewee_database: Any = super()  # peewee's stubs leave these out
        if not self._file.opened:
            connection: sqlite3.Connection = peewee_database._connect()
            return connection
        self._file.check()
        this: Any = self
        connection = self._file.connect_existing(this._timeout)
        try:
            peewee_database._add_conn_hooks(connection)
        except Exception:
            connection.close()
            raise
        return connection

    def rollback(self) -> None:
        # SQLite rolls a transaction back by itself after some errors (a full
        # disk, an I/O error); a ROLLBACK then fails and hides the error that
        # says what happened behind "no transaction is active".
        this: Any = self
        connection: Any = this._state.conn
        if connection is not None and not connection.in_transaction:
            return
        super().rollback()

    def begin(self, lock_type: str | None = None) -> None:
        self._file.check()
        super().begin(lock_type)

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        self.statements.note(sql)
        if self.transaction_depth() == 0:
            self._file.check()
        peewee_database: Any = super()
        return peewee_database.execute_sql(sql, params)


class _FaultLog:
    """Logs a database fault when it first appears and then once a minute while it
    lasts (every failing call meets it; the log must not grow with them)."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, fault: DomainError) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last.get(fault.reason, -FAULT_LOG_EVERY_S) < FAULT_LOG_EVERY_S:
                return
            self._last[fault.reason] = now
        log.error("database fault (%s): %s", fault.reason, fault.message)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what it wraps (peewee passes the driver's error as its first
    argument) and what it was raised from or during."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        link = pending.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        wrapped = [arg for arg in link.args[:1] if isinstance(arg, BaseException)]
        pending += [*wrapped, *(e for e in (link.__cause__, link.__context__) if e is not None)]
