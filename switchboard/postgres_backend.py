"""The PostgreSQL backend: a connection pool; the database's clock is "now".

Round trips are what a call costs once the database is a network hop away, so
this backend sends transaction control along with the statement that follows it
(`_DeferringPostgresDatabase`) and reads the database's clock once every few
seconds instead of once per transaction (`_DatabaseClock`).
"""

from __future__ import annotations

import logging
import math
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import peewee
import psycopg2
import psycopg2.extensions
from playhouse.pool import MaxConnectionsExceeded, PooledPostgresqlDatabase

from switchboard.database import DatabaseSettings, StatementCounter
from switchboard.errors import ConnectionLost, DomainError, TimedOut, Unavailable

log = logging.getLogger(__name__)

#: Seconds libpq waits for a connection (a dead or black-holed server): calls fail
#: fast with UNAVAILABLE rather than waiting out their deadlines.
CONNECT_TIMEOUT_S = 2
#: SQLSTATEs that mean the server went away or refused the session, not the statement.
_STATUS_UNKNOWN = psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN
_STATUS_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE
_CONNECTION_STATES = {"57P01", "57P02", "57P03", "53300"}  # admin/crash shutdown, starting, full


def _driver_errors_wrapped() -> Any:
    """peewee's context manager that re-raises driver errors as peewee's own."""
    module: Any = peewee
    return module.__exception_wrapper__


#: Begins `PostgresBackend.read_snapshot`'s transaction.
_BEGIN_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
#: SQLSTATEs of a statement that gave up: lock_not_available (lock_timeout, NOWAIT) and
#: query_canceled (statement_timeout, pg_cancel_backend).
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"


class _DeferringPostgresDatabase(PooledPostgresqlDatabase):  # type: ignore[misc]
    """Sends BEGIN, SAVEPOINT and RELEASE with the next statement instead of alone.

    Each costs a round trip of its own otherwise. They are queued (per thread, as
    peewee's connections are) and prefixed to the next statement in one simple-query
    message; a savepoint nobody wrote under, or a transaction that executed nothing,
    is never sent at all. COMMIT and ROLLBACK stay separate: their answer matters.
    Anything that takes a raw cursor (`executemany`) gets the queue flushed first.

    A bound on lock waits (`bounded`) travels the same way: `SET LOCAL lock_timeout`
    after each BEGIN, or before a statement run outside a transaction (the implicit
    transaction of a multi-statement message holds it for that statement only).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deferred = threading.local()
        self.statements = StatementCounter()

    def _queued(self) -> list[str]:
        queued: list[str] | None = getattr(self._deferred, "sql", None)
        if queued is None:
            queued = self._deferred.sql = []
        return queued

    def defer(self, sql: str) -> None:
        self._queued().append(sql)

    def undefer(self, sql: str) -> bool:
        """Takes `sql` back if it is the last statement queued (nothing ran after it)."""
        queued = self._queued()
        if queued and queued[-1] == sql:
            queued.pop()
            return True
        return False

    def _take_queued(self) -> str:
        queued = self._queued()
        prefix = "".join(f"{sql}; " for sql in queued)
        queued.clear()
        return prefix

    @contextmanager
    def bounded(self, lock_wait_ms: int) -> Iterator[None]:
        """Statements this thread sends in the block wait at most `lock_wait_ms` for a lock."""
        outer = getattr(self._deferred, "lock_wait_ms", None)
        self._deferred.lock_wait_ms = max(1, lock_wait_ms)  # 0 would mean no bound at all
        try:
            yield
        finally:
            self._deferred.lock_wait_ms = outer

    def _set_bound(self) -> str:
        lock_wait_ms: int | None = getattr(self._deferred, "lock_wait_ms", None)
        return "" if lock_wait_ms is None else f"SET LOCAL lock_timeout = {lock_wait_ms}"

    def begin_statement(self, begin: str = "BEGIN") -> str:
        """`begin` with this thread's bound on lock waits, as deferred (and taken back)."""
        bound = self._set_bound()
        return f"{begin}; {bound}" if bound else begin

    def _begun(self) -> str:
        begun: str = getattr(self._deferred, "begin", "BEGIN")
        return begun

    def begin(self, isolation_level: Any = None) -> None:
        assert isolation_level is None, "isolation levels are not used"
        self._queued().clear()
        self._deferred.begin = self.begin_statement()
        self.defer(self._deferred.begin)

    def execute_sql(self, sql: str, params: Any = None) -> Any:
        self.statements.note(sql)
        # peewee always has psycopg2 format the statement (params or ()), so a '%' in a
        # queued statement's rendered values would read as a placeholder: double it.
        queued = self._take_queued().replace("%", "%%")
        prefix = queued or self._bound_outside_transactions()
        return super().execute_sql(prefix + sql, params)

    def _bound_outside_transactions(self) -> str:
        """The bound for a statement outside a transaction (a transaction's BEGIN set it)."""
        bound = self._set_bound()
        if not bound or self.connection().get_transaction_status() != _STATUS_IDLE:
            return ""
        return f"{bound}; "

    def cursor(self, named_cursor: Any = None) -> Any:
        cursor = super().cursor(named_cursor)
        prefix = self._take_queued()
        if prefix:
            with _driver_errors_wrapped():
                cursor.execute(prefix)
        return cursor

    def end_read_only(self) -> None:
        """Ends a read-only transaction begun outside peewee's (`read_snapshot`)."""
        if not self.is_closed():
            self._end("COMMIT")

    def commit(self) -> None:
        if self.undefer(self._begun()):
            return  # the transaction never started: nothing to commit
        self._end("COMMIT")

    def rollback(self) -> None:
        if self.undefer(self._begun()):
            return
        self._queued().clear()  # savepoint statements are moot: the transaction ends
        self._end("ROLLBACK")

    def _end(self, statement: str) -> None:
        if self.is_closed():
            raise peewee.InterfaceError(f"cannot {statement}: the connection is not open")
        prefix = self._take_queued()
        with _driver_errors_wrapped():
            super().cursor().execute(prefix + statement)

    def _is_closed(self, conn: Any) -> bool:
        # peewee checks a pooled connection with a SELECT 1 at every check-out: a round
        # trip per call. A dead one is found by the call's first statement instead, and
        # the runner retries once on a fresh connection.
        return bool(conn.closed) or conn.get_transaction_status() == _STATUS_UNKNOWN

    def savepoint(self) -> Any:
        return _DeferredSavepoint(self)

    def close(self) -> Any:
        self._queued().clear()
        return super().close()


class _DeferredSavepoint(peewee._savepoint):
    """A savepoint sent with the next statement, released with the one after."""

    db: _DeferringPostgresDatabase

    def _begin(self) -> None:
        self.db.defer(f"SAVEPOINT {self.quoted_sid}")

    def commit(self, begin: bool = True) -> None:
        if not self.db.undefer(f"SAVEPOINT {self.quoted_sid}"):
            self.db.defer(f"RELEASE SAVEPOINT {self.quoted_sid}")
        if begin:
            self._begin()

    def rollback(self, begin: bool = True) -> None:
        if not self.db.undefer(f"SAVEPOINT {self.quoted_sid}"):
            self.db.defer(f"ROLLBACK TO SAVEPOINT {self.quoted_sid}")
        if begin:
            self._begin()


class _DatabaseClock:
    """The database's clock without a query per transaction.

    One `clock_timestamp()` is read every `resample_s` and advanced by this host's
    monotonic clock in between (which wall-clock steps on the host do not move), so
    replicas on hosts with skewed clocks still agree on leases; the error is half a
    round trip and the monotonic clock's drift over a few seconds.
    """

    def __init__(self, resample_s: float = 5.0) -> None:
        self._resample_s = resample_s
        self._sample: tuple[float, float] | None = None  # (database epoch, monotonic)

    def now(self, read_database_clock: Callable[[], float]) -> float:
        sample = self._sample
        if sample is None or time.monotonic() - sample[1] > self._resample_s:
            sent = time.monotonic()
            at_database = read_database_clock()
            sample = self._sample = (at_database, (sent + time.monotonic()) / 2)
        return sample[0] + (time.monotonic() - sample[1])


def _driver_error(exc: BaseException) -> BaseException:
    """The psycopg2 exception a peewee one wraps (peewee keeps it as `orig`)."""
    inner = getattr(exc, "orig", None)
    return inner if isinstance(inner, BaseException) else exc


def _is_connection_fault(exc: BaseException) -> bool:
    if isinstance(exc, peewee.InterfaceError | psycopg2.InterfaceError):
        return True  # "connection already closed"
    driver = _driver_error(exc)
    if isinstance(driver, psycopg2.InterfaceError):
        return True
    if isinstance(driver, psycopg2.OperationalError):
        code = driver.pgcode
        # No SQLSTATE: libpq's own error (refused, reset, timed out, closed unexpectedly).
        return code is None or code.startswith("08") or code in _CONNECTION_STATES
    return False


def _gave_up(exc: BaseException) -> TimedOut | None:
    """A statement that gave up waiting (see `TimedOut`), or None."""
    driver = _driver_error(exc)
    code = getattr(driver, "pgcode", None)
    if code == _LOCK_NOT_AVAILABLE:
        return TimedOut(
            "DATABASE_LOCK_TIMEOUT",
            "a table or row this call needs stayed locked by another database session "
            "for longer than the call could wait (its deadline, or --db-lock-timeout); "
            "the call wrote nothing and may be retried. pg_locks and pg_stat_activity "
            "show which session holds the lock",
        )
    if code == _QUERY_CANCELED:
        said = str(driver).strip().splitlines()[0:1]
        return TimedOut(
            "DATABASE_STATEMENT_TIMEOUT",
            "the database cancelled a statement of this call"
            + (f" ({said[0]})" if said else "")
            + ": it waited or ran past the database's statement_timeout, or was cancelled "
            "by an administrator; the call wrote nothing and may be retried",
        )
    return None


class _Listener:
    """One connection per process in LISTEN, on a daemon thread: calls `announced` for
    each batch of notifications, and after every (re)connection (commits made while
    it was away were announced to nobody). Reconnects after faults, backing off."""

    #: Seconds between checks of the stop flag while no notification comes.
    TICK_S = 0.5
    RETRY_S = (0.1, 0.5, 1.0, 2.0)

    def __init__(
        self, options: dict[str, Any], channel: str, announced: Callable[[], None]
    ) -> None:
        self._options = options
        self._channel = channel
        self._announced = announced
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pg-listen", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=self.TICK_S * 4)

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                self._listen_on_one_connection()
                failures = 0
            except (psycopg2.Error, OSError) as exc:
                if failures == 0:
                    log.warning(
                        "LISTEN %s: connection lost (%s); reconnecting",
                        self._channel,
                        str(exc).strip().splitlines()[:1],
                    )
                self._stopped.wait(self.RETRY_S[min(failures, len(self.RETRY_S) - 1)])
                failures += 1

    def _listen_on_one_connection(self) -> None:
        connection = psycopg2.connect(**self._options)
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f"LISTEN {self._channel}")
            self._announced()
            while not self._stopped.is_set():
                if select.select([connection], [], [], self.TICK_S)[0]:
                    connection.poll()
                    if connection.notifies:
                        connection.notifies.clear()
                        self._announced()
        finally:
            connection.close()


class PostgresBackend:
    name = "postgres"
    try_lock_sql = "pg_try_advisory_xact_lock(?)"
    for_update = " FOR UPDATE"
    skip_locked = True

    def octet_length(self, column: Any) -> Any:
        return peewee.fn.OCTET_LENGTH(column)

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")  # psycopg2's parameter style

    def __init__(self, url: str, settings: DatabaseSettings) -> None:
        parsed = urlparse(url)
        options: dict[str, Any] = {
            key: values[-1] for key, values in parse_qs(parsed.query).items()
        }
        options.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
        self.writer_threads = settings.writer_threads or 1
        self._clock = _DatabaseClock()
        self._connect_options: dict[str, Any] = dict(
            dbname=unquote(parsed.path.lstrip("/")) or "postgres",
            user=unquote(parsed.username) if parsed.username else None,
            password=unquote(parsed.password) if parsed.password else None,
            host=parsed.hostname or "127.0.0.1",
            port=parsed.port or 5432,
            **options,
        )
        self.database = _DeferringPostgresDatabase(
            self._connect_options["dbname"],
            user=self._connect_options["user"],
            password=self._connect_options["password"],
            host=self._connect_options["host"],
            port=self._connect_options["port"],
            max_connections=settings.pool_size,
            stale_timeout=300,
            # Wait this long for a free pooled connection, then fail (UNAVAILABLE).
            timeout=10,
            **options,
        )
        self.statements = self.database.statements

    def write_transaction(self) -> AbstractContextManager[Any]:
        transaction: AbstractContextManager[Any] = self.database.atomic()
        return transaction

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        # Sent with the first statement, like BEGIN; a snapshot taken at that statement
        # holds for the rest. Read-only: nothing to commit, but the transaction must end.
        database = self.database
        begin = database.begin_statement(_BEGIN_SNAPSHOT)
        database.defer(begin)
        try:
            yield
        except BaseException:
            if not database.undefer(begin):
                with suppress(Exception):  # the read's own error is the one to report
                    database.end_read_only()
            raise
        if not database.undefer(begin):
            database.end_read_only()

    def bound_lock_waits(self, seconds: float) -> AbstractContextManager[None]:
        # Rounded up: a bound taken from a deadline ends at or after it, never before.
        return self.database.bounded(math.ceil(seconds * 1000))

    @contextmanager
    def migration_lock(self, key: int) -> Iterator[None]:
        # A transaction-level advisory lock: released by the commit (or rollback)
        # of the transaction whose DDL it guards, never left behind by a crash.
        with self.database.atomic():
            self.database.execute_sql("SELECT pg_advisory_xact_lock(%s)", (key,))
            yield

    def now(self) -> float:
        # The database's clock, so replicas with skewed clocks agree on leases.
        return self._clock.now(self._read_clock)

    def _read_clock(self) -> float:
        with self.statements.uncounted():  # a sample every few seconds, whatever the call
            row = self.database.execute_sql(
                "SELECT extract(epoch from clock_timestamp())"
            ).fetchone()
        return float(row[0])

    def execute_later(self, sql: str, params: Sequence[Any]) -> None:
        database = self.database
        if not database.in_transaction():
            database.execute_sql(sql, params)
            return
        # Rendered here (psycopg2 quotes client-side anyway; no round trip), then
        # prefixed to the next statement or the COMMIT like BEGIN and SAVEPOINT are.
        with _driver_errors_wrapped():
            text = database.connection().cursor().mogrify(sql, params)
        database.statements.note(sql)  # travels with the next one, but is work of its own
        database.defer(text.decode())

    def notify(self, channel: str) -> None:
        # In the transaction: Postgres delivers it at COMMIT, never for a rollback, and
        # folds a group commit's identical notifications into one.
        self.execute_later(f"NOTIFY {channel}", ())

    def listen(self, channel: str, announced: Callable[[], None]) -> Callable[[], None] | None:
        listener = _Listener(self._connect_options, channel, announced)
        listener.start()
        return listener.stop

    def probe(self) -> None:
        try:
            with self.database.connection_context():
                self.database.execute_sql("SELECT 1")
        except Exception as exc:
            translated = self.translate(exc)
            if translated is None:
                raise
            raise translated from exc

    def probe_writes(self, tables: Sequence[str], wait_s: float) -> None:
        # The lock every INSERT, UPDATE and DELETE takes: it waits for a LOCK TABLE (any
        # mode but ACCESS SHARE and ROW SHARE) or DDL, as the calls' writes would, and
        # for nobody's rows. The transaction ends at once, so it holds it for no time.
        if not tables:
            return
        names = ", ".join('"' + table.replace('"', '""') + '"' for table in tables)
        database = self.database
        try:
            with (
                database.connection_context(),
                database.bounded(math.ceil(wait_s * 1000)),
                database.atomic(),
            ):
                database.execute_sql(f"LOCK TABLE {names} IN ROW EXCLUSIVE MODE")
        except Exception as exc:
            translated = self.translate(exc)
            if translated is None:
                raise
            raise translated from exc

    def translate(self, exc: BaseException) -> DomainError | None:
        gave_up = _gave_up(exc)
        if gave_up is not None:
            return gave_up
        if isinstance(exc, MaxConnectionsExceeded):
            return Unavailable(
                "DATABASE_BUSY",
                "every database connection of this server stayed busy; the call wrote "
                "nothing and may be retried",
            )
        if _is_connection_fault(exc):
            reason = str(_driver_error(exc)).strip().splitlines()[0:1]
            return ConnectionLost(
                "DATABASE_CONNECTION_LOST",
                "the database connection was lost"
                + (f" ({reason[0]})" if reason else "")
                + "; the call did not commit and may be retried",
            )
        return None
