"""The event log's contract on SQLite (a fresh file per test)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from session_service.core import Core
from tests.session.storage.contract import EventLogContract, migrated_core


class TestSqliteEventLog(EventLogContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        self.directory = tmp_path

    def open_core(self) -> AbstractContextManager[Core]:
        return migrated_core(f"sqlite:///{self.directory / 'session.db'}")
