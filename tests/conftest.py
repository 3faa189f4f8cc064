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


#: Modules that take minutes each (image builds, wheel installs, the frameworks' own
#: suites, browsers, benchmarks, long rounds), in the order they start: on several
#: workers (`python3 dev.py test`) they overlap the many short modules instead of
#: ending the run alone.
LONG_FIRST = (
    "tests/deploy/test_image.py",
    "tests/deploy/test_wheels.py",
    "tests/frameworks/openai_agents/",
    "tests/test_bench_sections.py",
    "tests/docs/",
    "tests/console/",
    "tests/chaos/",
    "tests/frameworks/",
    "tests/session/test_many_rewinds.py",
    "tests/test_quality.py",
)


def _start_rank(item: pytest.Item) -> int:
    return next(
        (rank for rank, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)),
        len(LONG_FIRST),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_rank)  # stable: each module keeps its own order


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
