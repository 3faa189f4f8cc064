"""Fixtures: a real SessionService (SQLite and Postgres, `database_url`) and savers on it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver

from tests.harness import EventLoopThread, InProcessSession, session_server


@pytest.fixture
def session(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url) as server:
        yield server


@pytest.fixture
def client(session: InProcessSession) -> Iterator[SessionClient]:
    with SessionClient(session.address) as session_client:
        yield session_client


@pytest.fixture
def saver(client: SessionClient) -> SwitchboardSaver:
    return SwitchboardSaver(client)
