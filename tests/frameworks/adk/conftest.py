"""Fixtures for the Google ADK session service's tests: a real SessionService (SQLite
file or Postgres schema, over gRPC) and a way to drive the adapter on an event loop of
the test's own."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlparse

import pytest
from google.adk.events import Event, EventActions
from google.genai import types
from switchboard_client.frameworks.adk import SwitchboardSessionService

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import POSTGRES_URL, EventLoopThread, InProcessSession, session_server

T = TypeVar("T")
APP = "shop"
USER = "ada"


@pytest.fixture
def server(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url) as started:
        yield started


def drive(address: str, scenario: Callable[[SwitchboardSessionService], Awaitable[T]]) -> T:
    """Runs `scenario` with an adapter for `address` on a fresh event loop."""

    async def main() -> T:
        service = SwitchboardSessionService(address)
        try:
            return await scenario(service)
        finally:
            await service.close()

    return asyncio.run(main())


def event(
    text: str = "",
    author: str = "user",
    invocation_id: str = "inv-1",
    state: dict[str, Any] | None = None,
) -> Event:
    """An ADK event: a text from `author`, with `state` as its state delta."""
    content = types.Content(role="user" if author == "user" else "model", parts=[])
    if text:
        content.parts = [types.Part(text=text)]
    return Event(
        invocation_id=invocation_id,
        author=author,
        content=content,
        actions=EventActions(state_delta=dict(state or {})),
    )


def texts(events: list[Event]) -> list[str]:
    return [e.content.parts[0].text for e in events if e.content and e.content.parts]


def log_head(server: InProcessSession) -> int:
    """The newest sequence of the log: unchanged when a refused call wrote nothing."""
    page = server.stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=1))
    return int(page.head_sequence)


def bytes_at_rest(database_url: str) -> bytes:
    """Everything the database keeps on disk for the test: the SQLite files (main, -wal,
    -shm), or a pg_dump of the test's Postgres schema (bytea columns come out as hex, so
    look for a marker's hex too)."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        files = [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]
        return b"".join(file.read_bytes() for file in files if file.exists())
    schema = unquote(urlparse(database_url).query).removeprefix("options=-csearch_path=")
    server = urlparse(POSTGRES_URL)
    dumped = subprocess.run(
        ["pg_dump", "-h", server.hostname or "127.0.0.1", "-p", str(server.port or 5432),
         "-U", server.username or "postgres", "-n", schema, server.path.lstrip("/")],
        capture_output=True, check=True, timeout=60,
    )  # fmt: skip
    return dumped.stdout
