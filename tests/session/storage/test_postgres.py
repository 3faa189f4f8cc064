"""The event log's contract on PostgreSQL (a fresh schema per test)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from session_service.core import Core
from tests.harness import postgres_schema
from tests.session.storage.contract import EventLogContract, migrated_core


@pytest.mark.postgres
class TestPostgresEventLog(EventLogContract):
    @contextmanager
    def open_core(self) -> Iterator[Core]:
        with postgres_schema() as url, migrated_core(url) as core:
            yield core
