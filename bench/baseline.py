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

from bench.stats import Measurement, summarise

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


def _timed_cycles(
    name: str, cycle: Callable[[int], None], seconds: float, warmup_s: float
) -> Measurement:
    """Runs `cycle(i)` back to back for warmup + seconds; measures the last `seconds`."""
    latencies: list[float] = []
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + seconds
    completed = 0
    i = 0
    while True:
        began = time.perf_counter()
        if began >= stop_at:
            break
        cycle(i)
        ended = time.perf_counter()
        i += 1
        if ended > stop_at:
            break
        if began >= measure_from:
            latencies.append(ended - began)
        if ended >= measure_from:
            completed += 1
    return summarise(name, 1, seconds, latencies, completed, channels=0)


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

    return _timed_cycles(f"raw sqlite3 {sync}", cycle, seconds, warmup_s)


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

        return _timed_cycles("raw psycopg2", cycle, seconds, warmup_s)
