"""In-process database floors: what the database allows with no gRPC and no service code,
one thread, measured in the same run as the figures compared with them.

- `delivery_floor`: the delivery cycle's three durable transactions straight through
  the driver (stdlib sqlite3, WAL, `BEGIN IMMEDIATE` … `COMMIT`; psycopg2): an INSERT
  of a PENDING row of the ledger's shape (insert-or-ignore), an UPDATE to ATTEMPTING
  and one to DELIVERED, each guarded by id + owner + fence + state;
- `claim_floor`: a dead owner's rows (bulk-inserted, untimed; Postgres then ANALYZE)
  claimed `batch` per transaction by one `UPDATE … WHERE id IN (SELECT … ORDER BY
  session_key, created_at, id LIMIT batch) RETURNING *`: the same rows in the same
  order as ClaimRecoverable, without its liveness check, abandon and gated passes;
- `session_floor`: one log-row INSERT per transaction through peewee (the ORM the
  server uses), a row shaped like `session_log` with the server's secondary indexes
  and a serialized Event of the benchmark's 100-byte message as payload.

The ledger table and its indexes mirror `delivery_service.store`'s, so every commit
maintains the same index set the server's does.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import peewee
import psycopg2
from psycopg2.extras import execute_values

from bench.seeding import ORPHAN_CONVERSATIONS
from bench.servers import Backend, postgres_schema, temp_dir
from bench.stats import Measurement, summarise, timed_loop
from bench.workloads import message_content
from delivery_service.records import compute_obligation_id
from switchboard.session.v1 import session_service_pb2 as pb

_COLUMNS = (
    "id, session_key, message_ref, content, platform, chat_id, thread_id, metadata, state, "
    "owner_instance_id, fence, attempts, needs_marker, platform_message_id, last_error, "
    "created_at, updated_at, next_attempt_at, delivered_at"
)
_INDEXES = (
    'CREATE INDEX "obligation_state_platform" ON "ledger_obligation" ("state", "platform")',
    'CREATE INDEX "obligation_session_key_created_at" '
    'ON "ledger_obligation" ("session_key", "created_at")',
    'CREATE INDEX "obligation_owner_instance_id" ON "ledger_obligation" ("owner_instance_id")',
    'CREATE INDEX "obligation_created_at_id" ON "ledger_obligation" ("created_at", "id")',
)


@dataclass
class _Driver:
    """One connection of a raw driver, with the few things the floors need of it."""

    connection: Any
    postgres: bool

    @property
    def param(self) -> str:
        return "%s" if self.postgres else "?"

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        cursor = self.connection.cursor()
        cursor.execute(sql.replace("?", self.param), params)
        return cursor

    def transaction(self) -> AbstractContextManager[None]:
        return _postgres_commit(self.connection) if self.postgres else _immediate(self)

    def create_ledger(self) -> None:
        real, integer, boolean = (
            ("DOUBLE PRECISION", "BIGINT", "BOOLEAN")
            if self.postgres
            else ("REAL", "INTEGER", "INTEGER")
        )
        with self.transaction():
            self.execute(
                'CREATE TABLE "ledger_obligation" ("id" VARCHAR(24) NOT NULL PRIMARY KEY, '
                '"session_key" TEXT NOT NULL, "message_ref" TEXT NOT NULL, '
                '"content" TEXT NOT NULL, "platform" VARCHAR(32) NOT NULL, '
                '"chat_id" TEXT NOT NULL, "thread_id" TEXT NOT NULL, "metadata" TEXT NOT NULL, '
                f'"state" VARCHAR(16) NOT NULL, "owner_instance_id" VARCHAR(64), '
                f'"fence" {integer} NOT NULL, "attempts" INTEGER NOT NULL, '
                f'"needs_marker" {boolean} NOT NULL, "platform_message_id" TEXT NOT NULL, '
                f'"last_error" TEXT NOT NULL, "created_at" {real} NOT NULL, '
                f'"updated_at" {real} NOT NULL, "next_attempt_at" {real}, "delivered_at" {real})'
            )
            for index in _INDEXES:
                self.execute(index)

    def insert_rows(self, rows: list[tuple[Any, ...]]) -> None:
        sql = f'INSERT INTO "ledger_obligation" ({_COLUMNS}) VALUES '
        with self.transaction():
            if self.postgres:
                execute_values(self.connection.cursor(), sql + "%s", rows, page_size=1000)
            else:
                self.connection.executemany(sql + f"({', '.join('?' * 19)})", rows)


@contextmanager
def _immediate(driver: _Driver) -> Iterator[None]:
    driver.execute("BEGIN IMMEDIATE")
    yield
    driver.execute("COMMIT")


@contextmanager
def _postgres_commit(connection: Any) -> Iterator[None]:
    yield  # psycopg2 begins a transaction with the first statement
    connection.commit()


@contextmanager
def _driver(backend: Backend) -> Iterator[_Driver]:
    """A raw connection to a fresh database of `backend` (SQLite: WAL, its synchronous)."""
    with temp_dir("bench-floor-") as directory:
        if backend.postgres:
            with postgres_schema() as url:
                connection = psycopg2.connect(url, connect_timeout=5)
                try:
                    yield _Driver(connection, postgres=True)
                finally:
                    connection.close()
            return
        connection = sqlite3.connect(directory / "floor.sqlite3", isolation_level=None)
        try:
            for pragma in ("journal_mode=WAL", f"synchronous={backend.sqlite_sync}"):
                connection.execute(f"PRAGMA {pragma}")
            yield _Driver(connection, postgres=False)
        finally:
            connection.close()


def _ledger_row(owner: str, i: int, now: float, false: Any, orphan: bool) -> tuple[Any, ...]:
    """Row `i` owned by `owner`: a delivery cycle's, or an orphan shaped as
    `bench.seeding.orphan(i)` seeds it."""
    if orphan:
        user = f"U{i % ORPHAN_CONVERSATIONS}"
        key, chat, thread, content = f"agent:main:slack:dm:{user}", user, "", f"reply {i}"
    else:
        key, chat, thread, content = "agent:bench:slack:channel:C0", "C0", "171.001", f"bench {i}"
    ref = f"m{i}"
    ids = (compute_obligation_id(key, ref, content), key, ref, content, "slack", chat, thread)
    return (*ids, "{}", "pending", owner, 1, 0, false, "", "", now, now, None, None)


# -- the delivery cycle ----------------------------------------------------------------------


def delivery_floor(backend: Backend, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """The cycle's three transactions, back to back, on a raw driver."""
    driver_name = "raw psycopg2" if backend.postgres else f"raw sqlite3 {backend.sqlite_sync}"
    with _driver(backend) as driver:
        driver.create_ledger()
        owner, false = uuid.uuid4().hex, False if driver.postgres else 0
        insert = (
            f'INSERT INTO "ledger_obligation" ({_COLUMNS}) VALUES ({", ".join("?" * 19)}) '
            "ON CONFLICT DO NOTHING"
        )
        attempting = (
            'UPDATE "ledger_obligation" SET "state" = ?, "updated_at" = ? '
            'WHERE "id" = ? AND "owner_instance_id" = ? AND "fence" = ? AND "state" IN (?)'
        )
        delivered = (
            'UPDATE "ledger_obligation" SET "state" = ?, "platform_message_id" = ?, '
            '"delivered_at" = ?, "updated_at" = ? '
            'WHERE "id" = ? AND "owner_instance_id" = ? AND "fence" = ? AND "state" IN (?, ?)'
        )

        def cycle(i: int) -> None:
            row = _ledger_row(owner, i, time.time(), false, orphan=False)
            with driver.transaction():
                moved = driver.execute(insert, row).rowcount
            with driver.transaction():
                to_attempting = ("attempting", time.time(), row[0], owner, 1, "pending")
                moved += driver.execute(attempting, to_attempting).rowcount
            now = time.time()
            with driver.transaction():
                to_delivered = (
                    "delivered",
                    f"pm-{i}",
                    now,
                    now,
                    row[0],
                    owner,
                    1,
                    "pending",
                    "attempting",
                )
                moved += driver.execute(delivered, to_delivered).rowcount
            if moved != 3:
                raise RuntimeError("a floor transaction missed its row")

        measurement = timed_loop(driver_name, cycle, seconds, warmup_s)
    measurement.rpcs_per_cycle = 3
    return measurement


# -- the claim of orphans ------------------------------------------------------------------------


def claim_floor(backend: Backend, count: int, batch: int = 1000) -> Measurement:
    """`count` orphans of a dead owner claimed `batch` per transaction (see the module doc);
    rows/s over the time from the first transaction to the last that claimed rows."""
    driver_name = "raw psycopg2" if backend.postgres else f"raw sqlite3 {backend.sqlite_sync}"
    with _driver(backend) as driver:
        driver.create_ledger()
        dead, rescuer, now = uuid.uuid4().hex, uuid.uuid4().hex, time.time()
        false = False if driver.postgres else 0
        driver.insert_rows([_ledger_row(dead, i, now, false, orphan=True) for i in range(count)])
        if driver.postgres:
            with driver.transaction():
                driver.execute('ANALYZE "ledger_obligation"')
        claim = (
            'UPDATE "ledger_obligation" SET "state" = \'attempting\', "owner_instance_id" = ?, '
            '"fence" = "fence" + 1, "attempts" = "attempts" + 1, '
            '"needs_marker" = ("state" <> \'pending\' OR "attempts" > 0), '
            '"next_attempt_at" = NULL, "updated_at" = ? WHERE "id" IN (SELECT "id" FROM '
            '"ledger_obligation" WHERE "owner_instance_id" = ? AND "state" IN '
            "('pending', 'attempting', 'failed') ORDER BY \"session_key\", \"created_at\", \"id\" "
            f"LIMIT ?) RETURNING {_COLUMNS}"
        )

        def claim_batch() -> int:
            with driver.transaction():
                return len(driver.execute(claim, (rescuer, time.time(), dead, batch)).fetchall())

        return _timed_claims(driver_name, claim_batch, count, batch)


def _timed_claims(name: str, claim_batch: Callable[[], int], count: int, batch: int) -> Measurement:
    latencies: list[float] = []
    claimed = 0
    started = last = time.perf_counter()
    while True:
        began = time.perf_counter()
        rows = claim_batch()
        if not rows:
            break
        last = time.perf_counter()
        claimed += rows
        latencies.append(last - began)
    measurement = summarise(
        name, 1, last - started, latencies, claimed, errors=int(claimed != count)
    )
    measurement.rpcs_per_cycle = len(latencies) / claimed if claimed else 0.0
    measurement.extra = {"rows": claimed, "calls": len(latencies), "limit": batch}
    return measurement


# -- the session log's insert -------------------------------------------------------------------


class FloorLogRow(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128, null=True)
    kind = peewee.CharField(max_length=32)
    payload = peewee.BlobField()

    class Meta:
        table_name = "session_log"
        indexes = (
            (("session_id", "seq"), False),
            (("agent", "session_id", "seq"), False),
            (("session_id", "kind", "seq"), False),
        )


def _payload(seq: int) -> bytes:
    """The serialized Event the server would log for append number `seq`."""
    message = pb.Message(role=pb.ROLE_USER, content=message_content(0, seq))
    event = pb.Event(
        sequence=seq,
        agent="bench-floor",
        session_id="s_benchfloor0000000000000000000000",
        session_version=seq + 1,
        message_appended=pb.MessageAppended(message=message),
    )
    event.time.FromNanoseconds(time.time_ns())
    return event.SerializeToString()


@contextmanager
def _peewee(backend: Backend) -> Iterator[peewee.Database]:
    with temp_dir("bench-session-floor-") as directory:
        if not backend.postgres:
            pragmas = {"journal_mode": "wal", "synchronous": backend.sqlite_sync}
            yield peewee.SqliteDatabase(str(directory / "floor.sqlite3"), pragmas=pragmas)
            return
        with postgres_schema() as url:
            parsed = urlparse(url)
            options: dict[str, Any] = {k: v[-1] for k, v in parse_qs(parsed.query).items()}
            yield peewee.PostgresqlDatabase(
                unquote(parsed.path.lstrip("/")) or "postgres",
                user=unquote(parsed.username) if parsed.username else None,
                host=parsed.hostname or "127.0.0.1",
                port=parsed.port or 5432,
                **options,
            )


def session_floor(backend: Backend, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """One log row per transaction (`atomic('IMMEDIATE')` on SQLite, `atomic()` on
    Postgres), back to back, through peewee."""
    name = "peewee postgres" if backend.postgres else f"peewee sqlite {backend.sqlite_sync}"
    with _peewee(backend) as database, database.bind_ctx([FloorLogRow]):
        database.connect()
        try:
            database.create_tables([FloorLogRow])
            atomic: Callable[[], Any] = (
                database.atomic if backend.postgres else lambda: database.atomic("IMMEDIATE")
            )

            def insert(i: int) -> None:
                with atomic():
                    FloorLogRow.insert(
                        seq=i + 1,
                        agent="bench-floor",
                        session_id="s_benchfloor0000000000000000000000",
                        kind="message_appended",
                        payload=_payload(i + 1),
                    ).execute()

            return timed_loop(name, insert, seconds, warmup_s)
        finally:
            database.close()
