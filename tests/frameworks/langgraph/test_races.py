"""Several of everything through `SwitchboardSaver`: two processes racing on one thread,
two server replicas on one Postgres database, a saver's calls across a server restart.

LangGraph has no conflict error for checkpointers: two runs on one thread both write,
and a run that read a checkpoint the other run also continued from makes a branch (as
with SqliteSaver and PostgresSaver). What the adapter guarantees is what these tests
check: every checkpoint and write put is stored once, none lost, none duplicated, and
every parent a checkpoint names is there."""

from __future__ import annotations

import multiprocessing
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest
from langgraph.checkpoint.base import CheckpointTuple
from switchboard_client import SessionClient
from switchboard_client.frameworks.langgraph import SwitchboardSaver

from tests.frameworks.langgraph import race_worker
from tests.harness import (
    EventLoopThread,
    InProcessSession,
    ServerProcess,
    postgres_schema,
    session_server,
)

TURNS = 6


def _thread(saver: SwitchboardSaver, thread_id: str) -> list[CheckpointTuple]:
    return list(saver.list({"configurable": {"thread_id": thread_id}}))


def _assert_whole(tuples: list[CheckpointTuple], workers: list[str], puts: int) -> None:
    """Each put stored once; every parent present; every turn's input and its echo in
    the checkpoint that followed it."""
    ids = [t.config["configurable"]["checkpoint_id"] for t in tuples]
    assert len(ids) == len(set(ids)) == puts
    parents = {t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config}
    assert parents <= set(ids)
    said = {line for t in tuples for line in t.checkpoint["channel_values"].get("said", [])}
    for worker in workers:
        for turn in range(TURNS):
            assert {f"{worker}-{turn}", f"echo of {worker}-{turn}"} <= said


def test_two_processes_race_on_one_thread(
    session: InProcessSession, saver: SwitchboardSaver
) -> None:
    start_at = time.time() + 3.0
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        runs = [
            pool.apply_async(race_worker.run, (session.address, worker, "shared", TURNS, start_at))
            for worker in ("a", "b")
        ]
        puts = sum(run.get(timeout=240) for run in runs)
    tuples = _thread(saver, "shared")
    _assert_whole(tuples, ["a", "b"], puts)
    parents = [t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config]
    print(f"checkpoints continued by both runs (branches): {len(parents) - len(set(parents))}")


@pytest.fixture
def replicas(loop_thread: EventLoopThread) -> Iterator[list[InProcessSession]]:
    """Two servers on one PostgreSQL schema (replicas need Postgres: not parametrised)."""
    with postgres_schema() as url, ExitStack() as stack:
        yield [stack.enter_context(session_server(loop_thread, url)) for _ in range(2)]


@pytest.mark.postgres
def test_two_replicas_on_postgres_serve_one_thread(replicas: list[InProcessSession]) -> None:
    with ExitStack() as stack:
        clients = [stack.enter_context(SessionClient(r.address)) for r in replicas]
        savers = [SwitchboardSaver(client) for client in clients]
        graphs = [race_worker.graph(saver) for saver in savers]
        config = {"configurable": {"thread_id": "replicated"}}

        def run(worker: int) -> None:
            for turn in range(TURNS):
                graphs[worker].invoke({"said": [f"r{worker}-{turn}"]}, config)

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(run, [0, 1]))
        seen = [_thread(saver, "replicated") for saver in savers]
        assert [t.config for t in seen[0]] == [t.config for t in seen[1]]
        _assert_whole(seen[0], ["r0", "r1"], 2 * TURNS * 3)

        # Erased through one replica: gone through the other, whose saver remembered the
        # thread's session; a new run there starts the thread afresh.
        savers[0].delete_thread("replicated")
        assert savers[1].get_tuple(config) is None
        assert _thread(savers[1], "replicated") == []
        assert graphs[1].invoke({"said": ["again"]}, config)["said"] == ["again", "echo of again"]
        assert len(_thread(savers[0], "replicated")) == 3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_saver_carries_on_after_the_server_restarts(database_url: str, tmp_path: Path) -> None:
    port = _free_port()
    listen = ("--session-listen", f"127.0.0.1:{port}")
    server = ServerProcess(database_url, tmp_path, *listen, service="session")
    server.start()
    try:
        with SessionClient(f"127.0.0.1:{port}", timeout_s=10.0) as client:
            saver = SwitchboardSaver(client)
            graph = race_worker.graph(saver)
            config = {"configurable": {"thread_id": "durable"}}
            graph.invoke({"said": ["before"]}, config)
            server.kill()
            server = ServerProcess(database_url, tmp_path, *listen, service="session")
            server.start()
            # The same saver and client: the session it remembered answers again.
            assert saver.get_tuple(config).checkpoint["channel_values"]["said"] == [  # type: ignore[union-attr]
                "before",
                "echo of before",
            ]
            after = graph.invoke({"said": ["after"]}, config)
            assert after["said"] == ["before", "echo of before", "after", "echo of after"]
            assert len(_thread(saver, "durable")) == 6
    finally:
        server.stop_quietly()
