"""The storage foundation: SQLite pragmas, IMMEDIATE writes, group commit isolation."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from delivery_service.app import DeliveryUnit
from session_service.app import SessionUnit
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings
from switchboard.errors import FailedPrecondition
from switchboard.runner import TransactionRunner
from tests.harness import postgres_schema


def test_sqlite_is_wal_full_sync_with_a_busy_timeout(tmp_path: Path) -> None:
    backend = open_backend(DatabaseSettings(url=f"sqlite:///{tmp_path / 'x.sqlite3'}"))
    database: Any = backend.database
    with database.connection_context():
        assert database.execute_sql("PRAGMA journal_mode").fetchone() == ("wal",)
        assert database.execute_sql("PRAGMA synchronous").fetchone() == (2,)  # FULL
        assert database.execute_sql("PRAGMA busy_timeout").fetchone() == (5000,)


def test_sqlite_write_transactions_take_the_write_lock_at_begin(tmp_path: Path) -> None:
    path = tmp_path / "x.sqlite3"
    backend = open_backend(DatabaseSettings(url=f"sqlite:///{path}"))
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    # Nothing is written inside, yet a second writer is already shut out: no
    # deferred lock upgrade can deadlock into "database is locked" later.
    with (
        backend.database.connection_context(),
        backend.write_transaction(),
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
    other.close()


def test_group_commit_rolls_back_only_the_refused_operation(database_url: str) -> None:
    settings = DatabaseSettings(url=database_url)
    backend = open_backend(settings)
    database: Any = backend.database
    with database.connection_context():
        database.execute_sql("CREATE TABLE gc_probe (tag VARCHAR(16) PRIMARY KEY)")
    runner = TransactionRunner(backend, settings)

    def insert(tag: str, refuse: bool = False, crash: bool = False) -> Any:
        def op(_now: float) -> str:
            database.execute_sql("INSERT INTO gc_probe (tag) VALUES (%s)" % ("'" + tag + "'"))
            if refuse:
                raise FailedPrecondition("TEST", "refused after writing")
            if crash:
                raise RuntimeError("a bug after writing")
            return tag

        return runner.submit_write(op)

    try:
        futures = [
            insert("a"),
            insert("b", refuse=True),
            insert("c"),
            insert("d", crash=True),
            insert("e"),
        ]
        assert futures[0].result(30) == "a"
        with pytest.raises(FailedPrecondition):
            futures[1].result(30)
        assert futures[2].result(30) == "c"
        with pytest.raises(RuntimeError):
            futures[3].result(30)
        assert futures[4].result(30) == "e"
        stored = runner.submit_read(
            lambda: [
                row[0] for row in database.execute_sql("SELECT tag FROM gc_probe ORDER BY tag")
            ]
        ).result(30)
        assert stored == ["a", "c", "e"]
    finally:
        runner.close()


@pytest.mark.parametrize("consistent", [True, False])
def test_a_consistent_read_sees_one_committed_state_across_its_statements(
    database_url: str, consistent: bool
) -> None:
    """A read of several statements with `consistent` is not torn by a commit between
    them (and without it, it is: the control that shows the probe can see a commit)."""
    settings = DatabaseSettings(url=database_url)
    backend = open_backend(settings)
    database: Any = backend.database
    with database.connection_context():
        database.execute_sql("CREATE TABLE snapshot_probe (n INTEGER)")
        database.execute_sql("INSERT INTO snapshot_probe (n) VALUES (1)")
    runner = TransactionRunner(backend, settings)

    def count() -> int:
        return int(database.execute_sql("SELECT COUNT(*) FROM snapshot_probe").fetchone()[0])

    def insert(_now: float) -> None:
        database.execute_sql("INSERT INTO snapshot_probe (n) VALUES (2)")

    def read_around_a_commit() -> tuple[int, int]:
        first = count()
        runner.submit_write(insert).result(timeout=30)  # commits on the writer's connection
        return first, count()

    try:
        first, second = runner.submit_read(read_around_a_commit, consistent).result(timeout=30)
        after = runner.submit_read(count).result(timeout=30)
    finally:
        runner.close()
    assert first == 1 and after == 2
    assert second == (1 if consistent else 2)


def test_a_deferred_write_with_a_percent_sign_reaches_the_database(database_url: str) -> None:
    """Postgres sends deferred writes with the next statement, rendered; a '%' in their
    values once read as a placeholder there (IndexError, an INTERNAL for the caller)."""
    backend = open_backend(DatabaseSettings(url=database_url))
    database: Any = backend.database
    value = "agent:main:telegram:dm:c=50%25off%3A%s"
    with database.connection_context():
        database.execute_sql("CREATE TABLE percent_probe (key VARCHAR(64) PRIMARY KEY)")
        with backend.write_transaction():
            backend.execute_later(
                "INSERT INTO percent_probe (key) VALUES (%s)".replace("%s", database.param),
                [value],
            )
            found = database.execute_sql(
                "SELECT key FROM percent_probe WHERE key = %s".replace("%s", database.param),
                [value],
            ).fetchall()
    assert found == [(value,)]


@pytest.mark.parametrize(("configured", "session", "delivery"), [(None, 1, 4), (3, 3, 3)])
def test_each_service_has_its_own_number_of_postgres_writer_threads(
    configured: int | None, session: int, delivery: int
) -> None:
    """Unless configured, the SessionService writes from one thread (its writes take the
    log's one lock in turn: more threads would split its group commits) and the
    DeliveryService from four (its rows are independent)."""
    with postgres_schema() as url:
        settings = DatabaseSettings(url=url, writer_threads=configured)
        for unit_class, expected in ((SessionUnit, session), (DeliveryUnit, delivery)):
            unit = unit_class(settings)
            try:
                writers = [t for t in threading.enumerate() if "-writer-" in t.name]
                assert unit.runner.backend.writer_threads == expected
                assert len(writers) == expected, unit_class.__name__
            finally:
                unit.close()
