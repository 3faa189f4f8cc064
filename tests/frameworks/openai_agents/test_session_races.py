"""Several of everything: two processes, two session objects and two server replicas
on one conversation. Shared sessions lose and duplicate nothing; exclusive ones let
one writer win and give the other `SessionConflict`, having written nothing."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from switchboard_client.frameworks.openai_agents import SessionConflict, SwitchboardSession
from switchboard_client.session import SessionClient

from tests.frameworks.openai_agents.conftest import AGENT, log_head, run, session
from tests.harness import ServerProcess

pytestmark = pytest.mark.slow

BATCHES = 25


def _conversation(target: str, **options: Any) -> tuple[SessionClient, SwitchboardSession]:
    client = SessionClient(target)
    return client, SwitchboardSession("shared", client, agent=AGENT, **options)


def _add_batches(target: str, writer: str) -> None:
    """A process appending BATCHES batches of two items."""
    client, conversation = _conversation(target)
    with client:
        for n in range(BATCHES):
            batch = [{"role": "user", "content": f"{writer}-{n}-{part}"} for part in "ab"]
            asyncio.run(conversation.add_items(batch))


def _pop(target: str, count: int) -> list[str]:
    client, conversation = _conversation(target)
    with client:
        popped = [asyncio.run(conversation.pop_item()) for _ in range(count)]
    return [item["content"] for item in popped if item is not None]


def _exclusive_turn(target: str, barrier: Any, writer: str) -> str:
    """Reads, waits for the other process to have read too, then writes its turn."""
    client, conversation = _conversation(target, exclusive=True)
    with client:
        asyncio.run(conversation.get_items())
        barrier.wait(timeout=30)
        try:
            asyncio.run(conversation.add_items([{"role": "user", "content": writer}]))
        except SessionConflict:
            return "conflict"
    return "won"


@pytest.fixture
def processes() -> Iterator[ProcessPoolExecutor]:
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield pool


def test_two_processes_appending_lose_and_duplicate_nothing(
    client: SessionClient, server: ServerProcess, processes: ProcessPoolExecutor
) -> None:
    writers = [processes.submit(_add_batches, server.address, name) for name in ("p1", "p2")]
    for writer in writers:
        writer.result(timeout=120)
    contents = [item["content"] for item in run(session(client, "shared").get_items())]
    assert len(contents) == len(set(contents)) == 2 * 2 * BATCHES
    for index in range(0, len(contents), 2):  # each add_items landed whole
        assert contents[index].endswith("-a") and contents[index + 1].endswith("-b")
        assert contents[index][:-2] == contents[index + 1][:-2]
    for name in ("p1", "p2"):  # and in each writer's order
        own = [c for c in contents if c.startswith(name)]
        assert own == [f"{name}-{n}-{part}" for n in range(BATCHES) for part in "ab"]


def test_two_processes_popping_never_pop_one_item_twice(
    client: SessionClient, processes: ProcessPoolExecutor, server: ServerProcess
) -> None:
    items = [{"role": "user", "content": f"item {n}"} for n in range(40)]
    run(session(client, "shared").add_items(items))
    poppers = [processes.submit(_pop, server.address, 25) for _ in range(2)]
    popped = [content for popper in poppers for content in popper.result(timeout=120)]
    assert sorted(popped) == sorted(item["content"] for item in items)
    assert run(session(client, "shared").get_items()) == []


def test_two_exclusive_processes_racing_one_wins_one_conflicts(
    client: SessionClient, server: ServerProcess, processes: ProcessPoolExecutor
) -> None:
    run(session(client, "shared").add_items([{"role": "user", "content": "start"}]))
    with multiprocessing.get_context("spawn").Manager() as manager:
        barrier = manager.Barrier(2)
        before = log_head(server)
        turns = [processes.submit(_exclusive_turn, server.address, barrier, w) for w in "AB"]
        outcomes = [turn.result(timeout=120) for turn in turns]
    assert sorted(outcomes) == ["conflict", "won"]
    winner = "AB"[outcomes.index("won")]
    assert log_head(server) == before + 1, "the loser wrote nothing"
    contents = [item["content"] for item in run(session(client, "shared").get_items())]
    assert contents == ["start", winner]


def test_an_exclusive_loser_rereads_and_retries(client: SessionClient) -> None:
    first = session(client, exclusive=True)
    second = session(client, exclusive=True)
    run(first.add_items([{"role": "user", "content": "one"}]))
    run(second.get_items())
    run(first.add_items([{"role": "assistant", "content": "two"}]))  # its own write: no conflict
    with pytest.raises(SessionConflict, match="changed by another writer"):
        run(second.add_items([{"role": "user", "content": "stale"}]))
    with pytest.raises(SessionConflict):
        run(second.pop_item())
    run(second.get_items())
    assert run(second.pop_item()) == {"role": "assistant", "content": "two"}
    with pytest.raises(SessionConflict):  # the pop moved the version past first's
        run(first.add_items([{"role": "user", "content": "stale too"}]))
    assert [i["content"] for i in run(first.get_items())] == ["one"]


def test_an_exclusive_writer_after_another_writers_clear_conflicts(client: SessionClient) -> None:
    first = session(client, exclusive=True)
    second = session(client, exclusive=True)
    run(first.add_items([{"role": "user", "content": "one"}]))
    run(second.get_items())
    run(first.clear_session())
    with pytest.raises(SessionConflict):
        run(second.add_items([{"role": "user", "content": "into the cleared conversation"}]))
    assert run(second.get_items()) == []
    run(second.add_items([{"role": "user", "content": "after re-reading"}]))
    assert run(first.get_items()) == [{"role": "user", "content": "after re-reading"}]


def test_a_shared_writer_after_another_writers_clear_writes_to_the_fresh_session(
    client: SessionClient,
) -> None:
    first, second = session(client), session(client)
    run(first.add_items([{"role": "user", "content": "one"}]))
    run(second.add_items([{"role": "user", "content": "two"}]))
    run(first.clear_session())
    run(second.add_items([{"role": "user", "content": "three"}]))
    assert run(first.get_items()) == [{"role": "user", "content": "three"}]


def test_a_reader_sees_another_writers_clear_and_what_follows_it(client: SessionClient) -> None:
    """A read asks which session answers the conversation now (the cleared session's
    history stays readable in the log: reading it again would show the old items), as
    two `SQLiteSession` objects on one id see each other's clear."""
    reader, writer = session(client), session(client)
    run(writer.add_items([{"role": "user", "content": "before the clear"}]))
    assert [i["content"] for i in run(reader.get_items())] == ["before the clear"]
    run(writer.clear_session())
    assert run(reader.get_items()) == []
    run(writer.add_items([{"role": "user", "content": "after the clear"}]))
    assert [i["content"] for i in run(reader.get_items())] == ["after the clear"]


def test_two_replicas_serve_one_conversation(database_url: str, tmp_path: Path) -> None:
    replicas = [
        ServerProcess(database_url, tmp_path / f"replica-{n}", service="session") for n in (1, 2)
    ]
    try:
        for replica in replicas:
            replica.start()
        clients = [SessionClient(replica.address) for replica in replicas]
        clients[0].create_agent(AGENT)
        one, two = (session(c, exclusive=True) for c in clients)
        run(one.add_items([{"role": "user", "content": "via one"}]))
        assert run(two.get_items()) == [{"role": "user", "content": "via one"}]
        run(two.add_items([{"role": "assistant", "content": "via two"}]))
        with pytest.raises(SessionConflict):  # one has not read two's write
            run(one.add_items([{"role": "user", "content": "stale"}]))

        async def race() -> list[BaseException | None]:
            await asyncio.gather(one.get_items(), two.get_items())
            turns = [s.add_items([{"role": "user", "content": "racer"}]) for s in (one, two)]
            return list(await asyncio.gather(*turns, return_exceptions=True))

        outcomes = run(race())
        assert sum(isinstance(o, SessionConflict) for o in outcomes) == 1, outcomes
        assert [i["content"] for i in run(one.get_items())] == ["via one", "via two", "racer"]
        run(two.get_items())  # two may be the loser: it re-reads before its next write
        assert run(two.pop_item()) == {"role": "user", "content": "racer"}
        assert len(run(one.get_items())) == 2
        for c in clients:
            c.close()
    finally:
        for replica in replicas:
            replica.stop_quietly()
