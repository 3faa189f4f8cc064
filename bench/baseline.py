"""Raw database floors: the cycle's three transactions without gRPC, peewee or the ledger.

The same three durable transactions the ledger runs for one delivery cycle,
issued by one thread straight through the database driver:

1. INSERT of a PENDING row of the ledger's shape (insert-or-ignore),
2. UPDATE to ATTEMPTING guarded by id + owner + fence + state,
3. UPDATE to DELIVERED guarded likewise,

each in its own transaction (SQLite: `BEGIN IMMEDIATE` … `COMMIT`; Postgres:
psycopg2's implicit BEGIN … `COMMIT`). The table and its indexes mirror
`delivery_service.store.ObligationRow`, so every commit maintains the same
index set the server's does.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from bench.stats import Measurement, summarise, timed_loop

SqliteSync = Literal["FULL", "NORMAL"]

_INDEXES = (
    'CREATE INDEX "obligation_state_platform" ON "ledger_obligation" ("state", "platform")',
    'CREATE INDEX "obligation_session_key_created_at" '
    'ON "ledger_obligation" ("session_key", "created_at")',
    'CREATE INDEX "obligation_owner_instance_id" ON "ledger_obligation" ("owner_instance_id")',
    'CREATE INDEX "obligation_created_at_id" ON "ledger_obligation" ("created_at", "id")',
)


def _table_ddl(real: str, integer: str, boolean: str) -> str:
    return (
        'CREATE TABLE "ledger_obligation" ("id" VARCHAR(24) NOT NULL PRIMARY KEY, '
        '"session_key" TEXT NOT NULL, "message_ref" TEXT NOT NULL, "content" TEXT NOT NULL, '
        '"platform" VARCHAR(32) NOT NULL, "chat_id" TEXT NOT NULL, "thread_id" TEXT NOT NULL, '
        '"metadata" TEXT NOT NULL, "state" VARCHAR(16) NOT NULL, '
        f'"owner_instance_id" VARCHAR(64), "fence" {integer} NOT NULL, '
        f'"attempts" INTEGER NOT NULL, "needs_marker" {boolean} NOT NULL, '
        '"platform_message_id" TEXT NOT NULL, "last_error" TEXT NOT NULL, '
        f'"created_at" {real} NOT NULL, "updated_at" {real} NOT NULL, '
        f'"next_attempt_at" {real}, "delivered_at" {real})'
    )


_COLUMNS = (
    "id, session_key, message_ref, content, platform, chat_id, thread_id, metadata, state, "
    "owner_instance_id, fence, attempts, needs_marker, platform_message_id, last_error, "
    "created_at, updated_at, next_attempt_at, delivered_at"
)


def _obligation_id(session_key: str, message_ref: str, content: str) -> str:
    payload = f"{session_key}|{message_ref}|{content}"
    return hashlib.sha256(payload.encode("utf-8", "replace")).hexdigest()[:24]


def _row(owner: str, i: int, now: float, false: Any) -> tuple[Any, ...]:
    session_key = "agent:bench:slack:channel:C0"
    message_ref = f"m{i}"
    content = f"bench 0 {i}"
    return (
        _obligation_id(session_key, message_ref, content),
        session_key,
        message_ref,
        content,
        "slack",
        "C0",
        "171.001",
        "{}",
        "pending",
        owner,
        1,
        0,
        false,
        "",
        "",
        now,
        now,
        None,
        None,
    )


# -- SQLite -----------------------------------------------------------------------------------


def sqlite_floor(sync: SqliteSync, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """The three transactions on stdlib sqlite3 (WAL, synchronous=`sync`) in a temp dir."""
    directory = Path(tempfile.mkdtemp(prefix="bench-sqlite-floor-"))
    try:
        connection = sqlite3.connect(
            directory / "floor.sqlite3", isolation_level=None, check_same_thread=True
        )
        try:
            return _sqlite_cycles(connection, sync, seconds, warmup_s)
        finally:
            connection.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _sqlite_cycles(
    connection: sqlite3.Connection, sync: SqliteSync, seconds: float, warmup_s: float
) -> Measurement:
    execute = connection.execute
    execute("PRAGMA journal_mode=WAL")
    execute(f"PRAGMA synchronous={sync}")
    execute("PRAGMA busy_timeout=5000")
    execute("PRAGMA foreign_keys=1")
    execute(_table_ddl("REAL", "INTEGER", "INTEGER"))
    for index in _INDEXES:
        execute(index)
    owner = uuid.uuid4().hex
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
        row = _row(owner, i, time.time(), 0)
        obligation_id = row[0]
        execute("BEGIN IMMEDIATE")
        if execute(insert, row).rowcount != 1:
            raise RuntimeError("floor insert was ignored")
        execute("COMMIT")
        execute("BEGIN IMMEDIATE")
        moved = execute(
            attempting, ("attempting", time.time(), obligation_id, owner, 1, "pending")
        ).rowcount
        execute("COMMIT")
        now = time.time()
        execute("BEGIN IMMEDIATE")
        moved += execute(
            delivered,
            ("delivered", f"pm-{i}", now, now, obligation_id, owner, 1, "pending", "attempting"),
        ).rowcount
        execute("COMMIT")
        if moved != 2:
            raise RuntimeError("floor update missed its row")

    return timed_loop(f"raw sqlite3 {sync}", cycle, seconds, warmup_s)


# -- Postgres ---------------------------------------------------------------------------------


@contextmanager
def _pg_connection(url: str) -> Iterator[Any]:
    import psycopg2

    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        yield connection
    finally:
        connection.close()


def postgres_floor(url: str, seconds: float, warmup_s: float = 0.5) -> Measurement:
    """The three transactions on psycopg2, one connection, one commit each.

    `url` must point at a fresh, empty schema (its search_path): the table is
    created there and dropped with the schema by the caller.
    """
    with _pg_connection(url) as connection:
        cursor = connection.cursor()
        cursor.execute(_table_ddl("DOUBLE PRECISION", "BIGINT", "BOOLEAN"))
        for index in _INDEXES:
            cursor.execute(index)
        connection.commit()
        owner = uuid.uuid4().hex
        insert = (
            f'INSERT INTO "ledger_obligation" ({_COLUMNS}) VALUES ({", ".join(["%s"] * 19)}) '
            "ON CONFLICT DO NOTHING"
        )
        attempting = (
            'UPDATE "ledger_obligation" SET "state" = %s, "updated_at" = %s '
            'WHERE "id" = %s AND "owner_instance_id" = %s AND "fence" = %s AND "state" IN (%s)'
        )
        delivered = (
            'UPDATE "ledger_obligation" SET "state" = %s, "platform_message_id" = %s, '
            '"delivered_at" = %s, "updated_at" = %s WHERE "id" = %s AND '
            '"owner_instance_id" = %s AND "fence" = %s AND "state" IN (%s, %s)'
        )

        def cycle(i: int) -> None:
            row = _row(owner, i, time.time(), False)
            obligation_id = row[0]
            cursor.execute(insert, row)
            inserted = cursor.rowcount
            connection.commit()
            cursor.execute(
                attempting, ("attempting", time.time(), obligation_id, owner, 1, "pending")
            )
            moved = cursor.rowcount
            connection.commit()
            now = time.time()
            cursor.execute(
                delivered,
                (
                    "delivered",
                    f"pm-{i}",
                    now,
                    now,
                    obligation_id,
                    owner,
                    1,
                    "pending",
                    "attempting",
                ),
            )
            moved += cursor.rowcount
            connection.commit()
            if inserted != 1 or moved != 2:
                raise RuntimeError("floor transaction missed its row")

        return timed_loop("raw psycopg2", cycle, seconds, warmup_s)


# -- claim floors: recovering orphans ---------------------------------------------------------

#: States a claim takes over (the ledger's OWED states).
_OWED = ("pending", "attempting", "failed")
#: Conversations the orphans are spread over (as `bench.orphans` seeds them).
_CONVERSATIONS = 97


def _orphan_row(owner: str, i: int, now: float, false: Any) -> tuple[Any, ...]:
    """Row `i` of a dead instance's backlog, shaped as `bench.orphans.orphan(i)` seeds it."""
    user = f"U{i % _CONVERSATIONS}"
    session_key = f"agent:main:slack:dm:{user}"
    message_ref, content = f"m{i}", f"reply {i}"
    return (
        _obligation_id(session_key, message_ref, content),
        session_key,
        message_ref,
        content,
        "slack",
        user,
        "",
        "{}",
        "pending",
        owner,
        1,
        0,
        false,
        "",
        "",
        now,
        now,
        None,
        None,
    )


def _claim_sql(param: str) -> str:
    """One batch of a claim: the oldest owed rows of the dead owner, in delivery order,
    moved to ATTEMPTING under the rescuer with a new fence, returned whole."""
    owed = ", ".join(f"'{state}'" for state in _OWED)
    return (
        'UPDATE "ledger_obligation" SET "state" = \'attempting\', '
        f'"owner_instance_id" = {param}, "fence" = "fence" + 1, "attempts" = "attempts" + 1, '
        '"needs_marker" = ("state" <> \'pending\' OR "attempts" > 0), '
        f'"next_attempt_at" = NULL, "updated_at" = {param} '
        'WHERE "id" IN (SELECT "id" FROM "ledger_obligation" '
        f'WHERE "owner_instance_id" = {param} AND "state" IN ({owed}) '
        f'ORDER BY "session_key", "created_at", "id" LIMIT {param}) '
        f"RETURNING {_COLUMNS}"
    )


def _timed_claims(name: str, claim_batch: Callable[[], int], count: int, batch: int) -> Measurement:
    """Calls `claim_batch()` (one transaction, returns the rows it claimed) until it
    claims nothing; rows/s over the batches that claimed rows."""
    latencies: list[float] = []
    claimed = 0
    started = last = time.perf_counter()
    while True:
        began = time.perf_counter()
        rows = claim_batch()
        ended = time.perf_counter()
        if not rows:
            break
        claimed += rows
        latencies.append(ended - began)
        last = ended
    errors = 0 if claimed == count else 1
    measurement = summarise(name, 1, last - started, latencies, claimed, errors=errors)
    measurement.rpcs_per_cycle = len(latencies) / claimed if claimed else 0.0
    measurement.extra = {"rows": claimed, "batches": len(latencies), "limit": batch}
    return measurement


def sqlite_claim_floor(sync: SqliteSync, count: int, batch: int = 1000) -> Measurement:
    """`count` orphans (bulk-inserted, untimed) claimed `batch` rows per transaction on
    stdlib sqlite3 (WAL, synchronous=`sync`): one UPDATE … RETURNING per batch."""
    directory = Path(tempfile.mkdtemp(prefix="bench-sqlite-claim-floor-"))
    try:
        connection = sqlite3.connect(
            directory / "floor.sqlite3", isolation_level=None, check_same_thread=True
        )
        try:
            execute = connection.execute
            execute("PRAGMA journal_mode=WAL")
            execute(f"PRAGMA synchronous={sync}")
            execute("PRAGMA busy_timeout=5000")
            execute(_table_ddl("REAL", "INTEGER", "INTEGER"))
            for index in _INDEXES:
                execute(index)
            dead, rescuer = uuid.uuid4().hex, uuid.uuid4().hex
            now = time.time()
            execute("BEGIN IMMEDIATE")
            connection.executemany(
                f'INSERT INTO "ledger_obligation" ({_COLUMNS}) VALUES ({", ".join("?" * 19)})',
                (_orphan_row(dead, i, now, 0) for i in range(count)),
            )
            execute("COMMIT")
            claim = _claim_sql("?")

            def claim_batch() -> int:
                execute("BEGIN IMMEDIATE")
                rows = execute(claim, (rescuer, time.time(), dead, batch)).fetchall()
                execute("COMMIT")
                return len(rows)

            return _timed_claims(f"raw sqlite3 {sync}", claim_batch, count, batch)
        finally:
            connection.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def postgres_claim_floor(url: str, count: int, batch: int = 1000) -> Measurement:
    """`count` orphans (bulk-inserted, then ANALYZE, untimed) claimed `batch` rows per
    transaction on psycopg2: one UPDATE … RETURNING per batch. `url`: a fresh schema."""
    from psycopg2.extras import execute_values

    with _pg_connection(url) as connection:
        cursor = connection.cursor()
        cursor.execute(_table_ddl("DOUBLE PRECISION", "BIGINT", "BOOLEAN"))
        for index in _INDEXES:
            cursor.execute(index)
        dead, rescuer = uuid.uuid4().hex, uuid.uuid4().hex
        now = time.time()
        execute_values(
            cursor,
            f'INSERT INTO "ledger_obligation" ({_COLUMNS}) VALUES %s',
            [_orphan_row(dead, i, now, False) for i in range(count)],
            page_size=1000,
        )
        connection.commit()
        cursor.execute('ANALYZE "ledger_obligation"')
        connection.commit()
        claim = _claim_sql("%s")

        def claim_batch() -> int:
            cursor.execute(claim, (rescuer, time.time(), dead, batch))
            rows = cursor.fetchall()
            connection.commit()
            return len(rows)

        return _timed_claims("raw psycopg2", claim_batch, count, batch)
