"""Fixtures of the chaos suite: process bookkeeping and a Postgres-only database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.common import Processes
from tests.harness import postgres_schema, postgres_unreachable_reason


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh Postgres schema (for the multi-replica and clock tests)."""
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    with postgres_schema() as url:
        yield url
