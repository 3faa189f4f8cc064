"""Fixtures: every behavioural test runs on SQLite and on PostgreSQL.

Postgres tests skip when no server answers, except in CI (CI=true) or with
SWITCHBOARD_REQUIRE_POSTGRES=1, where an unreachable Postgres fails the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import (
    EventLoopThread,
    postgres_schema,
    postgres_unreachable_reason,
)

_REQUIRE_POSTGRES = os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get(
    "SWITCHBOARD_REQUIRE_POSTGRES", ""
) in ("1", "true")
_POSTGRES_DOWN = postgres_unreachable_reason()


def pytest_sessionstart(session: pytest.Session) -> None:
    if _POSTGRES_DOWN and _REQUIRE_POSTGRES:
        pytest.exit(f"{_POSTGRES_DOWN}; CI requires the Postgres tests to run", returncode=3)


def pytest_report_header() -> str:
    if _POSTGRES_DOWN:
        return f"postgres: SKIPPING Postgres tests. {_POSTGRES_DOWN}"
    return "postgres: reachable; Postgres tests run"


@pytest.fixture(scope="session")
def loop_thread() -> Iterator[EventLoopThread]:
    thread = EventLoopThread()
    yield thread
    thread.close()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database: a SQLite file or a Postgres schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'switchboard.sqlite3'}"
        return
    if _POSTGRES_DOWN:
        pytest.skip(_POSTGRES_DOWN)
    with postgres_schema() as url:
        yield url
