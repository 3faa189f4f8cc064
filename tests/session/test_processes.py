"""SIGKILL during an append storm: every acknowledged append is there, in order, and the
state equals a from-scratch replay."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from session_service import recovery
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, ServerProcess, session_server
from tests.session.conftest import append, create_agent, resolve, user_message, web

pytestmark = pytest.mark.slow
WRITERS = 4


def test_sigkill_during_an_append_storm_loses_nothing_acknowledged(
    database_url: str, tmp_path: Path, loop_thread: EventLoopThread
) -> None:
    server = ServerProcess(database_url, tmp_path, service="session")
    try:
        channel = grpc.insecure_channel(server.start())
        stub = pb_grpc.SessionServiceStub(channel)
        create_agent(stub)
        sessions = [resolve(stub, **web(f"tab-{i}")).session.session_id for i in range(WRITERS)]
        acknowledged: dict[str, list[tuple[int, str]]] = {s: [] for s in sessions}
        stop = threading.Event()

        def writer(session_id: str) -> None:
            for n in range(100_000):
                if stop.is_set():
                    return
                try:
                    event = stub.AppendEvents(
                        pb.AppendEventsRequest(
                            agent="main", session_id=session_id, events=[user_message(f"{n}")]
                        ),
                        timeout=10,
                    ).events[0]
                except grpc.RpcError:
                    return
                acknowledged[session_id].append((event.sequence, f"{n}"))

        threads = [threading.Thread(target=writer, args=(s,)) for s in sessions]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while sum(map(len, acknowledged.values())) < 400 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        channel.close()
    finally:
        server.stop_quietly()

    with session_server(loop_thread, database_url) as restarted:
        for session_id, appended in acknowledged.items():
            history = restarted.stub.GetHistory(
                pb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
            ).messages
            stored = [(m.sequence, m.message.content) for m in history]
            assert stored[: len(appended)] == appended, "acknowledged appends, in order"
            assert len(stored) - len(appended) <= 1, "at most the one in flight at the kill"
        state_before = {
            s: restarted.stub.GetSessionState(pb.GetSessionStateRequest(agent="main", session_id=s))
            for s in sessions
        }
        report = recovery.rebuild(restarted.unit.core)
        assert not report.differed, report.differences
        for session_id, before in state_before.items():
            after = restarted.stub.GetSessionState(
                pb.GetSessionStateRequest(agent="main", session_id=session_id)
            )
            assert after == before


def test_sigkill_mid_rewind_is_all_or_nothing_and_repeatable(
    database_url: str, tmp_path: Path, loop_thread: EventLoopThread
) -> None:
    server = ServerProcess(database_url, tmp_path, service="session")
    try:
        channel = grpc.insecure_channel(server.start())
        stub = pb_grpc.SessionServiceStub(channel)
        create_agent(stub)
        sessions = [resolve(stub, **web(f"tab-{i}")).session.session_id for i in range(20)]
        for session_id in sessions:
            append(stub, session_id, user_message("kept"))
        mark = stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="cut")).checkpoint.sequence
        for session_id in sessions:
            for _ in range(5):
                append(stub, session_id, *[user_message("abandoned")] * 100)
        rewinding = threading.Thread(
            target=lambda: _quietly(lambda: stub.Rewind(pb.RewindRequest(sequence=mark))),
        )
        rewinding.start()
        time.sleep(random.uniform(0.0, 0.04))  # the rewind itself takes about 35 ms here
        server.kill()
        rewinding.join(timeout=30)
        channel.close()
    finally:
        server.stop_quietly()

    with session_server(loop_thread, database_url) as restarted:
        lengths = {len(_texts(restarted.stub, s)) for s in sessions}
        assert lengths in ({1}, {501}), f"half a rewind: {lengths}"
        first = restarted.stub.Rewind(pb.RewindRequest(sequence=mark))
        again = restarted.stub.Rewind(pb.RewindRequest(sequence=mark))
        assert first.unchanged == (lengths == {1}), "it happens once: before the kill or now"
        assert again.unchanged and not again.HasField("record")
        assert all(_texts(restarted.stub, s) == ["kept"] for s in sessions)
        assert not recovery.rebuild(restarted.unit.core).differed


def _texts(stub: pb_grpc.SessionServiceStub, session_id: str) -> list[str]:
    request = pb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
    return [m.message.content for m in stub.GetHistory(request).messages]


def _quietly(call: Callable[[], object]) -> None:
    with contextlib.suppress(grpc.RpcError):
        call()
