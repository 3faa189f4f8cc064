"""The SQLite backend: one file, WAL, one writer at a time."""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import peewee

from switchboard.database import DatabaseSettings
from switchboard.errors import DomainError


class SqliteBackend:
    name = "sqlite"
    for_update = ""
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

    def translate(self, exc: Exception) -> DomainError | None:
        # Placeholder: the SQLite fault work maps disk-full and lock errors here.
        return None

    def probe(self) -> None:
        # Placeholder until the fault-handling work: a plain round trip.
        database: Any = self.database
        with database.connection_context():
            database.execute_sql("SELECT 1")
