"""The routing-key fixture (tests/fixtures/routing-keys, written by 89c0bf6) on either
backend: the SQLite file itself, or a Postgres schema made as that release made it
(session migrations 1 to 6, frozen since) holding the same rows."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

from session_service.migrations import SESSION_SCHEMA, storage_formats
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "routing-keys"
#: The SQLite backend's own clock table, and the history the old schema's migration writes.
_NOT_COPIED = {"switchboard_clock_anchor", "session_schema_history"}


def written() -> dict[str, Any]:
    """What the old release wrote and read back (tests/upgrade/key_sample.py)."""
    loaded: dict[str, Any] = json.loads((FIXTURE / "written.json").read_text())
    return loaded


def install(url: str) -> None:
    """Puts the old release's database at `url` (a fresh SQLite path or Postgres schema)."""
    if url.startswith("sqlite:///"):
        shutil.copy(FIXTURE / "session.sqlite3", Path(url.removeprefix("sqlite:///")))
        return
    backend = open_backend(DatabaseSettings(url=url))
    old_schema = SESSION_SCHEMA.migrations[: SESSION_SCHEMA.migrations.index(storage_formats) + 1]
    migrations.migrate(backend, dataclasses.replace(SESSION_SCHEMA, migrations=old_schema))
    source = sqlite3.connect(FIXTURE / "session.sqlite3")
    database: Any = backend.database
    try:
        with database.connection_context(), database.atomic():
            tables = [row[0] for row in source.execute("SELECT name FROM sqlite_master "
                                                       "WHERE type = 'table'")]  # fmt: skip
            for table in sorted(set(tables) - _NOT_COPIED):
                _copy(source, database, table)
    finally:
        source.close()
        database.close()


def _copy(source: sqlite3.Connection, database: Any, table: str) -> None:
    cursor = source.execute(f"SELECT * FROM {table}")
    columns = [description[0] for description in cursor.description]
    booleans = {
        name
        for (name,) in database.execute_sql(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s AND data_type = 'boolean'",
            (table,),
        ).fetchall()
    }
    database.execute_sql(f"DELETE FROM {table}")  # the old schema's seed rows
    insert = (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
    )
    for row in cursor.fetchall():
        values = [
            bool(value) if name in booleans and value is not None else value
            for name, value in zip(columns, row, strict=True)
        ]
        database.execute_sql(insert, values)
