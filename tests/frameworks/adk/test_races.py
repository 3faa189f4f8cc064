"""Several of everything through the ADK adapter: two processes racing on one session
(one wins, the other gets ADK's StaleSessionError), counting races that lose and
duplicate nothing, two server replicas on one database, and a call after the server
restarted."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from switchboard_client.frameworks.adk import SwitchboardSessionService

from tests.frameworks.adk import racers
from tests.frameworks.adk.conftest import APP, USER, drive, event, texts
from tests.harness import EventLoopThread, InProcessSession, ServerProcess, session_server

_SPAWN = multiprocessing.get_context("spawn")


@contextmanager
def _replicas(database_url: str, loop_thread: EventLoopThread) -> Iterator[list[str]]:
    """Two SessionService servers on one database."""
    with (
        session_server(loop_thread, database_url) as first,
        session_server(loop_thread, database_url) as second,
    ):
        yield [first.address, second.address]


def _create(address: str) -> None:
    async def scenario(service: SwitchboardSessionService) -> None:
        await service.create_session(app_name=APP, user_id=USER, session_id="s1")

    drive(address, scenario)


def _race(function: Any, arguments: Sequence[tuple[Any, ...]]) -> list[Any]:
    """`function` in one spawned process per argument tuple, all at once; each tuple
    gets a shared barrier as its last argument."""
    with _SPAWN.Manager() as manager, _SPAWN.Pool(len(arguments)) as pool:
        barrier = manager.Barrier(len(arguments))
        return pool.starmap(function, [(*args, barrier) for args in arguments], chunksize=1)


def _stored(address: str) -> Any:
    async def scenario(service: SwitchboardSessionService) -> Any:
        return await service.get_session(app_name=APP, user_id=USER, session_id="s1")

    return drive(address, scenario)


@pytest.mark.slow
def test_two_processes_append_at_once_one_wins_one_gets_stale_session(
    server: InProcessSession,
) -> None:
    _create(server.address)
    outcomes = _race(racers.append_once, [(server.address, "p1"), (server.address, "p2")])
    assert sorted(outcomes) == ["stale", "won"]
    winner = ["p1", "p2"][outcomes.index("won")]
    stored = _stored(server.address)
    assert texts(stored.events) == [winner]
    assert stored.state == {"winner": winner}


@pytest.mark.slow
def test_two_replicas_two_processes_one_wins_and_counting_loses_nothing(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """Each process on its own replica: the version check holds across replicas (it is
    the database's), and read-modify-write with ADK's reload-on-stale loses no update
    and stores no event twice."""
    with _replicas(database_url, loop_thread) as (first, second):
        _create(first)
        outcomes = _race(racers.append_once, [(first, "p1"), (second, "p2")])
        assert sorted(outcomes) == ["stale", "won"]

        times = 15
        stale = _race(racers.count_up, [(first, "a", times), (second, "b", times)])
        stored = _stored(second)
    counted = [text for text in texts(stored.events) if text[0] in "ab"]
    assert sorted(counted) == sorted([f"{p}-{i}" for p in "ab" for i in range(times)])
    assert stored.state["count"] == 2 * times, f"lost updates (stale errors met: {stale})"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.slow
def test_a_call_after_the_server_restarts_finds_everything(
    database_url: str, tmp_path: Path
) -> None:
    """One adapter (one channel) across a server restart on the same address."""
    listen = f"127.0.0.1:{_free_port()}"

    def start() -> ServerProcess:
        process = ServerProcess(
            database_url, tmp_path, "--session-listen", listen, service="session"
        )
        process.start()
        return process

    first = start()

    async def scenario(service: SwitchboardSessionService) -> None:
        try:
            session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
            await service.append_event(session, event("before", state={"user:n": 1}))
        finally:
            first.terminate()
        second = start()
        try:
            again = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
            assert again is not None and texts(again.events) == ["before"]
            await service.append_event(again, event("after", state={"user:n": 2}))
            # The pre-restart object is stale now, and says so.
            with pytest.raises(ValueError, match="modified in storage"):
                await service.append_event(session, event("stale"))
            final = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
            assert final is not None and texts(final.events) == ["before", "after"]
            assert await service.get_user_state(app_name=APP, user_id=USER) == {"n": 2}
        finally:
            second.terminate()

    drive(listen, scenario)
