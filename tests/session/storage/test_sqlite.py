"""The event log's contract on SQLite (a fresh file per test)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from session_service.composition import build_core
from session_service.core import Core
from session_service.migrations import SESSION_SCHEMA
from switchboard import migrations
from switchboard.database import DatabaseSettings, open_backend
from tests.session.storage.contract import EventLogContract


class TestSqliteEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        self.directory = tmp_path

    @contextmanager
    def open_core(self) -> Iterator[Core]:
        settings = DatabaseSettings(url=f"sqlite:///{self.directory / 'session.db'}")
        backend = open_backend(settings)
        migrations.prepare(backend, SESSION_SCHEMA)
        core = build_core(backend, settings)
        try:
            yield core
        finally:
            core.runner.close()
