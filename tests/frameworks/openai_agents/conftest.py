"""Fixtures of the OpenAI Agents adapter's tests: a real session server (a child
process, on the `database_url` backends: SQLite and Postgres) and a client with the
agent whose conversations the tests hold."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from switchboard_client.frameworks.openai_agents import SwitchboardSession
from switchboard_client.session import SessionClient

from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.frameworks.openai_agents.sdist import unpacked_sdist
from tests.harness import ServerProcess
from tests.session.frameworks import head

AGENT = "assistant"
T = TypeVar("T")


@pytest.fixture
def server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(database_url, tmp_path / "server", service="session")
    process.start()
    try:
        yield process
    finally:
        process.stop_quietly()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[SessionClient]:
    with SessionClient(server.address) as client:
        client.create_agent(AGENT)
        yield client


def session(
    client: SessionClient, session_id: str = "chat-1", **options: object
) -> SwitchboardSession:
    return SwitchboardSession(session_id, client, agent=AGENT, **options)  # type: ignore[arg-type]


def log_head(server: ServerProcess) -> int:
    """The log's newest sequence: unchanged across a call means it wrote nothing."""
    with grpc.insecure_channel(server.address) as channel:
        return head(pb_grpc.SessionServiceStub(channel))


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@pytest.fixture(scope="session")
def sdk_sdist(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SDK's sdist, unpacked (downloaded once into pytest's cache directory)."""
    cache = getattr(request.config, "cache", None)
    where = cache.mkdir("openai-agents-sdist") if cache else tmp_path_factory.mktemp("sdist")
    return unpacked_sdist(Path(where))
