"""The event log's contract on PostgreSQL (a fresh schema per test)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from session_service.composition import build_core
from session_service.core import Core
from session_service.migrations import SESSION_SCHEMA
from switchboard import migrations
from switchboard.database import DatabaseSettings, open_backend
from tests.harness import postgres_schema
from tests.session.storage.contract import EventLogContract


@pytest.mark.postgres
class TestPostgresEventLog(EventLogContract):
    @contextmanager
    def open_core(self) -> Iterator[Core]:
        with postgres_schema() as url:
            settings = DatabaseSettings(url=url)
            backend = open_backend(settings)
            migrations.prepare(backend, SESSION_SCHEMA)
            core = build_core(backend, settings)
            try:
                yield core
            finally:
                core.runner.close()
