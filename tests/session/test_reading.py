"""Reading: listing sessions with filters and pages, hundreds of idle watchers, the rebuild CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import InProcessSession
from tests.session.conftest import append, create_agent, resolve, user_message, web

WATCHERS = 300


def test_list_sessions_filters_and_pages_newest_first(service: InProcessSession) -> None:
    create_agent(service.stub)
    created = [resolve(service.stub, **web(f"tab-{i}")).session.session_id for i in range(5)]
    cron = resolve(service.stub, transport="cron", conversation_id="digest").session.session_id
    service.stub.EndSession(pb.EndSessionRequest(agent="main", session_id=created[0]))
    seen: list[str] = []
    token = ""
    while True:
        page = service.stub.ListSessions(
            pb.ListSessionsRequest(agent="main", transport="web", page_size=2, page_token=token)
        )
        seen += [s.session_id for s in page.sessions]
        token = page.next_page_token
        if not token:
            break
    assert seen == created[::-1]
    open_ones = service.stub.ListSessions(
        pb.ListSessionsRequest(agent="main", status=pb.SESSION_STATUS_OPEN)
    )
    assert [s.session_id for s in open_ones.sessions] == [cron, *created[:0:-1]]


def test_hundreds_of_idle_watchers_cost_no_threads(service: InProcessSession) -> None:
    """The aio server holds idle streams as coroutines: no thread per watcher."""
    create_agent(service.stub)
    session = resolve(service.stub, **web()).session
    session_id = session.session_id
    threads_before = threading.active_count()

    async def watch_all() -> list[str]:
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)
            streams = [
                stub.WatchEvents(
                    pb.WatchEventsRequest(
                        session_id=session_id, after_sequence=session.last_sequence
                    )
                )
                for _ in range(WATCHERS)
            ]
            # Every stream is open and idle on the server before the append.
            await asyncio.sleep(1.0)
            threads_while_idle = threading.active_count()
            assert threads_while_idle - threads_before < 10, threads_while_idle
            await asyncio.to_thread(append, service.stub, session_id, user_message("wake up"))
            received = await asyncio.wait_for(
                asyncio.gather(*(stream.read() for stream in streams)), timeout=30
            )
            for stream in streams:
                stream.cancel()
            contents = []
            for item in received:
                assert isinstance(item, pb.WatchEventsResponse), item
                contents.append(item.event.message_appended.message.content)
            return contents

    assert asyncio.run(watch_all()) == ["wake up"] * WATCHERS


@pytest.mark.slow
def test_rebuild_command_reports_identical_projections(
    service: InProcessSession, database_url: str, tmp_path: Path
) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    append(service.stub, session_id, user_message("hi"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "switchboard_cli",
            "session",
            "rebuild",
            "--database-url",
            database_url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "replayed 3 events" in result.stdout
    assert "routes: identical" in result.stdout
    assert "sessions: identical" in result.stdout
