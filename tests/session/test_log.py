"""The global log: atomic appends, versions, the inbox, history, state, snapshots, watching."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import pytest

from session_service import recovery
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web
from tests.status import error_reason


def _open(service: InProcessSession, tab: str = "tab-1") -> str:
    return resolve(service.stub, **web(tab)).session.session_id


def _state(service: InProcessSession, session_id: str) -> pb.SessionState:
    request = pb.GetSessionStateRequest(agent="main", session_id=session_id)
    return service.stub.GetSessionState(request).state


@pytest.fixture
def main_agent(service: InProcessSession) -> InProcessSession:
    create_agent(service.stub)
    return service


def test_batch_append_is_atomic_and_versioned(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    response = append(main_agent.stub, session_id, user_message("hi"), user_message("there"))
    assert response.version == 3  # opened, then two messages
    assert [e.session_version for e in response.events] == [2, 3]
    assert response.events[1].sequence == response.events[0].sequence + 1
    bad = pb.SessionEventInput(
        message_appended=pb.MessageAppended(message=pb.Message(content="no role"))
    )
    with pytest.raises(grpc.RpcError) as refused:
        append(main_agent.stub, session_id, user_message("kept?"), bad)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _state(main_agent, session_id).session.message_count == 2, "nothing of the batch"


def test_expected_version_mismatch_is_aborted(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    append(main_agent.stub, session_id, user_message("one"), expected_version=1)
    with pytest.raises(grpc.RpcError) as refused:
        append(main_agent.stub, session_id, user_message("stale"), expected_version=1)
    assert refused.value.code() == grpc.StatusCode.ABORTED
    assert error_reason(refused.value) == "VERSION_MISMATCH"
    assert _state(main_agent, session_id).session.message_count == 1


def test_inbox_posts_never_conflict_with_a_running_turn(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    version = _state(main_agent, session_id).session.version
    for text in ("peer says hi", "cron says hi"):
        main_agent.stub.PostToInbox(
            pb.PostToInboxRequest(
                agent="main",
                session_id=session_id,
                message=pb.Message(role=pb.ROLE_USER, content=text, sender="peer:planner"),
            )
        )
    turn = append(main_agent.stub, session_id, user_message("reply"), expected_version=version)
    assert turn.version == version + 1
    state = _state(main_agent, session_id)
    assert [q.message.content for q in state.inbox] == ["peer says hi", "cron says hi"]
    drain = pb.SessionEventInput(
        inbox_drained=pb.InboxDrained(through_sequence=state.inbox[0].sequence)
    )
    append(main_agent.stub, session_id, drain)
    assert [q.message.content for q in _state(main_agent, session_id).inbox] == ["cron says hi"]


def test_outbox_task_and_temp_state(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    reply = pb.Message(role=pb.ROLE_ASSISTANT, content="done")
    logged = append(
        main_agent.stub,
        session_id,
        pb.SessionEventInput(outbox_queued=pb.OutboxQueued(message=reply)),
        pb.SessionEventInput(task_set=pb.TaskSet(task=pb.Task(task_id="t1", description="x"))),
        pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(set={"a": "1", "b": "2"})),
        pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(removed=["a"])),
    )
    state = _state(main_agent, session_id)
    assert [q.message.content for q in state.outbox] == ["done"]
    assert state.current_task.task_id == "t1"
    assert dict(state.temp_state) == {"b": "2"}
    append(
        main_agent.stub,
        session_id,
        pb.SessionEventInput(
            outbox_acked=pb.OutboxAcked(through_sequence=logged.events[0].sequence)
        ),
        pb.SessionEventInput(task_cleared=pb.TaskCleared()),
    )
    state = _state(main_agent, session_id)
    assert list(state.outbox) == [] and not state.HasField("current_task")


def test_one_gap_free_sequence_across_agents_and_sessions(start_session: StartSession) -> None:
    servers = [start_session(), start_session()]
    create_agent(servers[0].stub, "main")
    create_agent(servers[0].stub, "other")
    sessions = [
        (agent, resolve(servers[0].stub, agent, **web(f"tab-{i}")).session.session_id)
        for i, agent in enumerate(["main", "other", "main", "other"])
    ]
    errors: list[BaseException] = []

    def writer(index: int) -> None:
        agent, session_id = sessions[index]
        try:
            for n in range(25):
                append(servers[index % 2].stub, session_id, user_message(f"{n}"), agent=agent)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    stream = servers[1].stub.WatchEvents(pb.WatchEventsRequest(), timeout=10)
    sequences = []
    for item in stream:
        sequences.append(item.event.sequence)
        if len(sequences) == 2 + 4 + 100:
            stream.cancel()
            break
    assert sequences == list(range(1, len(sequences) + 1))


def test_history_windows(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    for n in range(10):
        append(main_agent.stub, session_id, user_message(f"m{n}"))
    newest = main_agent.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id, limit=3, newest=True)
    ).messages
    assert [q.message.content for q in newest] == ["m7", "m8", "m9"]
    after = main_agent.stub.GetHistory(
        pb.GetHistoryRequest(
            agent="main", session_id=session_id, after_sequence=newest[0].sequence, limit=5
        )
    ).messages
    assert [q.message.content for q in after] == ["m8", "m9"]


def test_state_from_snapshots_equals_a_full_replay(start_session: StartSession) -> None:
    service = start_session(SessionLimits(snapshot_every=5, watch_poll_s=0.2))
    create_agent(service.stub)
    session_id = _open(service)
    for n in range(23):
        append(
            service.stub,
            session_id,
            pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(set={f"k{n % 4}": f"{n}"})),
        )
        service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key=f"m{n % 3}", value=f"{n}"))
    store: Any = service.unit.store
    with store.database.connection_context():
        snapshots = store.tables.Snapshot.select().count()
    assert snapshots >= 8, "sessions and agents were snapshotted every 5 events"
    with_snapshots = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    )
    with store.database.connection_context():
        store.snapshots.delete_snapshots()
    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences
    replayed = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    )
    assert replayed == with_snapshots
    assert replayed.state.temp_state["k2"] == "22"


def test_rebuild_repairs_damaged_projections(main_agent: InProcessSession) -> None:
    session_id = _open(main_agent)
    append(main_agent.stub, session_id, user_message("hi"))
    store: Any = main_agent.unit.store
    with store.database.connection_context():
        store.tables.Route.delete().execute()
        store.tables.Session.update(version=99).execute()
    report = recovery.rebuild(main_agent.unit.core)
    assert report.differences["routes"] == 1
    assert report.differences["sessions"] == 2  # the damaged row out, the true one in
    assert resolve(main_agent.stub, **web()).session.session_id == session_id
    assert _state(main_agent, session_id).session.version == 2


def test_watch_resumes_filters_and_follows_live(main_agent: InProcessSession) -> None:
    first = _open(main_agent, "a")
    second = _open(main_agent, "b")
    logged = append(main_agent.stub, first, user_message("one")).events[0]
    stream = main_agent.stub.WatchEvents(
        pb.WatchEventsRequest(session_id=first, after_sequence=logged.sequence - 1), timeout=10
    )
    received = [next(stream).event]
    append(main_agent.stub, second, user_message("elsewhere"))
    append(main_agent.stub, first, user_message("two"))
    received.append(next(stream).event)
    stream.cancel()
    assert [e.message_appended.message.content for e in received] == ["one", "two"]
    assert all(e.session_id == first for e in received)
