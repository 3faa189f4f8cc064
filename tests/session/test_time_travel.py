"""Time travel: reyn's rewind cases on the global log, checkout, retention."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest

from session_service import recovery
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web
from tests.status import error_reason


def _history(stub: pb_grpc.SessionServiceStub, session_id: str, agent: str = "main") -> list[str]:
    messages = stub.GetHistory(
        pb.GetHistoryRequest(agent=agent, session_id=session_id, limit=1000)
    ).messages
    return [m.message.content for m in messages]


def _checkpoint(stub: pb_grpc.SessionServiceStub, label: str) -> int:
    return int(stub.CreateCheckpoint(pb.CreateCheckpointRequest(label=label)).checkpoint.sequence)


def _rewind(stub: pb_grpc.SessionServiceStub, to: int | str) -> pb.Event:
    request = (
        pb.RewindRequest(sequence=to) if isinstance(to, int) else pb.RewindRequest(checkpoint=to)
    )
    return stub.Rewind(request).record


def _state(
    stub: pb_grpc.SessionServiceStub, session_id: str, agent: str = "main"
) -> pb.SessionState:
    return stub.GetSessionState(pb.GetSessionStateRequest(agent=agent, session_id=session_id)).state


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def chat(service: InProcessSession) -> tuple[InProcessSession, str]:
    create_agent(service.stub)
    return service, resolve(service.stub, **web()).session.session_id


def test_rewind_skips_abandoned_events_and_keeps_later_work(
    chat: tuple[InProcessSession, str],
) -> None:
    service, session_id = chat
    stub = service.stub
    append(stub, session_id, user_message("m1"))
    mark = _checkpoint(stub, "before")
    append(stub, session_id, user_message("m2"), user_message("m3"))
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="k", value="after"))
    record = _rewind(stub, "before")
    assert record.rewound.to_sequence == mark and record.rewound.checkpoint == "before"
    assert _history(stub, session_id) == ["m1"]
    # The version moves past the abandoned ones (1 opened, 2-4 appended), never back to 2.
    version = _state(stub, session_id).session.version
    assert version == 5
    assert "k" not in stub.GetAgent(pb.GetAgentRequest(name="main")).agent.memory
    append(stub, session_id, user_message("m4"), expected_version=version)
    assert _history(stub, session_id) == ["m1", "m4"]
    audit = stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id, include_abandoned=True)
    ).messages
    assert [(m.message.content, m.abandoned) for m in audit] == [
        ("m1", False), ("m2", True), ("m3", True), ("m4", False),
    ]  # fmt: skip


def test_sessions_created_after_the_cut_vanish_and_ended_ones_reopen(
    chat: tuple[InProcessSession, str],
) -> None:
    service, session_id = chat
    stub = service.stub
    mark = _checkpoint(stub, "cut")
    later = resolve(stub, **web("later")).session.session_id
    stub.EndSession(pb.EndSessionRequest(agent="main", session_id=session_id, reason="bye"))
    reset = resolve(stub, **web()).session.session_id  # the key now opens a new session
    assert reset != session_id
    _rewind(stub, mark)
    for gone in (later, reset):
        with pytest.raises(grpc.RpcError) as refused:
            stub.GetSession(pb.GetSessionRequest(agent="main", session_id=gone))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    reopened = stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id)).session
    assert reopened.status == pb.SESSION_STATUS_OPEN
    assert resolve(stub, **web()).session.session_id == session_id, "routing is back too"
    listed = stub.ListSessions(pb.ListSessionsRequest(agent="main")).sessions
    assert [s.session_id for s in listed] == [session_id]


def test_agents_created_after_the_cut_vanish(service: InProcessSession) -> None:
    create_agent(service.stub, "main")
    mark = _checkpoint(service.stub, "cut")
    create_agent(service.stub, "late")
    _rewind(service.stub, mark)
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.GetAgent(pb.GetAgentRequest(name="late"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert [a.name for a in service.stub.ListAgents(pb.ListAgentsRequest()).agents] == ["main"]
    create_agent(service.stub, "late")  # the name is free again


def test_rewinding_into_an_abandoned_sequence_is_refused(
    chat: tuple[InProcessSession, str],
) -> None:
    service, session_id = chat
    stub = service.stub
    mark = _checkpoint(stub, "cut")
    inside = append(stub, session_id, user_message("x")).events[0].sequence
    _rewind(stub, mark)
    with pytest.raises(grpc.RpcError) as refused:
        _rewind(stub, inside)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "REWIND_INTO_ABANDONED"


def test_checkout_undoes_a_rewind(chat: tuple[InProcessSession, str]) -> None:
    service, session_id = chat
    stub = service.stub
    mark = _checkpoint(stub, "cut")
    tip = append(stub, session_id, user_message("a"), user_message("b")).events[-1].sequence
    _rewind(stub, mark)
    append(stub, session_id, user_message("other branch"))
    stub.Checkout(pb.CheckoutRequest(sequence=tip))
    assert _history(stub, session_id) == ["a", "b"]
    append(stub, session_id, user_message("c"))
    assert _history(stub, session_id) == ["a", "b", "c"]


def _agents(stub: pb_grpc.SessionServiceStub) -> list[str]:
    return [agent.name for agent in stub.ListAgents(pb.ListAgentsRequest()).agents]


def test_the_empty_log_is_reached_only_when_asked_for(chat: tuple[InProcessSession, str]) -> None:
    """Sequence 0 abandons every agent and session: refused as an unset field or a
    bare 0 (test_bad_input), done with empty_log, and undone by a checkout."""
    service, session_id = chat
    stub = service.stub
    tip = append(stub, session_id, user_message("a")).events[-1].sequence
    preview = stub.Checkout(pb.CheckoutRequest(sequence=0, empty_log=True, preview=True))
    assert (preview.to_sequence, preview.summary.abandoned_count) == (0, tip)
    assert not preview.HasField("record") and _agents(stub) == ["main"]
    emptied = stub.Checkout(pb.CheckoutRequest(sequence=0, empty_log=True))
    assert emptied.record.rewound.to_sequence == 0 and emptied.summary.abandoned_count == tip
    assert _agents(stub) == []
    stub.Checkout(pb.CheckoutRequest(sequence=tip))
    assert _agents(stub) == ["main"] and _history(stub, session_id) == ["a"]
    rewound = stub.Rewind(pb.RewindRequest(sequence=0, empty_log=True))
    assert rewound.to_sequence == 0 and _agents(stub) == []


def test_nested_rewinds_resolve_latest_first(chat: tuple[InProcessSession, str]) -> None:
    service, session_id = chat
    stub = service.stub
    append(stub, session_id, user_message("a"))
    first = _checkpoint(stub, "first")
    append(stub, session_id, user_message("b"))
    second = _checkpoint(stub, "second")
    append(stub, session_id, user_message("c"))
    _rewind(stub, second)
    assert _history(stub, session_id) == ["a", "b"]
    kept = append(stub, session_id, user_message("d")).events[0].sequence
    append(stub, session_id, user_message("e"))
    _rewind(stub, kept)  # a partial rewind inside the newer branch
    assert _history(stub, session_id) == ["a", "b", "d"]
    _rewind(stub, first)  # subsumes both earlier rewinds
    assert _history(stub, session_id) == ["a"]


def test_repeating_a_rewind_is_idempotent(chat: tuple[InProcessSession, str]) -> None:
    service, session_id = chat
    stub = service.stub
    mark = _checkpoint(stub, "cut")
    append(stub, session_id, user_message("x"))
    first = _rewind(stub, mark)
    head = _checkpoint(stub, "after")
    again = stub.Rewind(pb.RewindRequest(sequence=mark))
    assert (again.unchanged, again.HasField("record"), again.to_sequence) == (True, False, mark)
    assert again.summary == pb.MoveSummary(), "nothing abandoned"
    assert _checkpoint(stub, "again") == head, "no second record"
    assert first.rewound.to_sequence == mark
    assert _history(stub, session_id) == []


def test_rewind_beyond_retention_is_out_of_range(service: InProcessSession) -> None:
    stub = service.stub
    create_agent(stub)
    session_id = resolve(stub, **web()).session.session_id
    for n in range(6):
        append(stub, session_id, user_message(f"m{n}"))
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=session_id))
    tail = append(stub, session_id, user_message("tail"), user_message("tail2")).events
    with pytest.raises(grpc.RpcError) as refused:
        stub.TruncateLog(pb.TruncateLogRequest(below_sequence=tail[1].sequence))
    assert error_reason(refused.value) == "SNAPSHOT_NEEDED", "'tail' is in no snapshot"
    truncated = stub.TruncateLog(pb.TruncateLogRequest(below_sequence=tail[0].sequence))
    assert truncated.retained_from == tail[0].sequence and truncated.deleted_count > 0
    with pytest.raises(grpc.RpcError) as refused:
        _rewind(stub, 3)
    assert refused.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error_reason(refused.value) == "REWIND_BEYOND_RETENTION"
    assert _history(stub, session_id) == ["tail", "tail2"], "older history was truncated"
    assert _state(stub, session_id).session.message_count == 8, "the state is whole"


def test_versions_never_repeat_for_an_id_whose_first_life_was_truncated(
    service: InProcessSession,
) -> None:
    """Rewind before a session and an agent, truncate their abandoned events away, create
    both ids again: each starts above every version of its first life, so a writer still
    holding a version of the first life is refused."""
    stub = service.stub
    create_agent(stub)
    keeper = resolve(stub, **web()).session.session_id
    mark = _checkpoint(stub, "before")
    spawned = stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="main.twice"))
    stale = spawned.session.version
    first_life = append(stub, "main.twice", user_message("one"), user_message("two")).version
    helper = create_agent(stub, "helper")
    helper = stub.PutMemory(pb.PutMemoryRequest(agent="helper", key="k", value="v")).agent
    _rewind(stub, mark)
    # Snapshots of what lives on make the log below the head unnecessary.
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=keeper))
    head = _checkpoint(stub, "after")
    truncated = stub.TruncateLog(pb.TruncateLogRequest(below_sequence=head))
    assert truncated.deleted_count > 0

    again = stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="main.twice"))
    assert again.session.version > first_life
    with pytest.raises(grpc.RpcError) as refused:
        append(stub, "main.twice", user_message("stale writer"), expected_version=stale)
    assert refused.value.code() == grpc.StatusCode.ABORTED
    assert _history(stub, "main.twice") == []
    assert create_agent(stub, "helper").version > helper.version


def test_a_two_agent_rewind_is_one_cut_even_under_racing_appends(
    start_session: StartSession,
) -> None:
    servers = [start_session(), start_session()]
    stub = servers[0].stub
    sessions = {}
    for agent in ("alpha", "beta"):
        create_agent(stub, agent)
        sessions[agent] = resolve(stub, agent, **web()).session.session_id
        append(stub, sessions[agent], user_message("before"), agent=agent)
    mark = _checkpoint(stub, "cut")
    acknowledged: dict[str, list[int]] = {"alpha": [], "beta": []}
    stop = threading.Event()

    def writer(agent: str, server: InProcessSession) -> None:
        n = 0
        while not stop.is_set() and n < 2000:
            n += 1
            event = append(server.stub, sessions[agent], user_message(f"{n}"), agent=agent)
            acknowledged[agent].append(event.events[0].sequence)

    threads = [
        threading.Thread(target=writer, args=("alpha", servers[0])),
        threading.Thread(target=writer, args=("beta", servers[1])),
    ]
    for thread in threads:
        thread.start()
    _wait_until(lambda: min(len(v) for v in acknowledged.values()) >= 20)
    cut = _rewind(servers[1].stub, mark).sequence
    _wait_until(lambda: min(len([s for s in v if s > cut]) for v in acknowledged.values()) >= 5)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    for agent, session_id in sessions.items():
        history = stub.GetHistory(
            pb.GetHistoryRequest(agent=agent, session_id=session_id, limit=1000)
        ).messages
        kept = [m.sequence for m in history]
        assert history[0].message.content == "before"
        assert kept[1:] == [s for s in acknowledged[agent] if s > cut], agent
        assert all(s <= mark or s > cut for s in kept)


def test_projections_after_rewinds_equal_a_rebuild(chat: tuple[InProcessSession, str]) -> None:
    service, session_id = chat
    stub = service.stub
    mark = _checkpoint(stub, "cut")
    resolve(stub, **web("gone"))
    stub.ResetSession(pb.ResetSessionRequest(agent="main", session_id=session_id, reason="/new"))
    tip = append(stub, resolve(stub, **web()).session.session_id, user_message("x")).events[0]
    _rewind(stub, mark)
    stub.Checkout(pb.CheckoutRequest(sequence=tip.sequence))
    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences


def test_a_cut_inside_a_tool_call_cycle_leaves_nothing_dangling(
    chat: tuple[InProcessSession, str],
) -> None:
    service, session_id = chat
    stub = service.stub
    call = pb.ToolCall(id="call-1", name="search", arguments='{"q": "x"}')
    events = append(
        stub,
        session_id,
        user_message("find x"),
        pb.SessionEventInput(
            message_appended=pb.MessageAppended(
                message=pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[call])
            )
        ),
        pb.SessionEventInput(
            message_appended=pb.MessageAppended(
                message=pb.Message(role=pb.ROLE_TOOL, tool_call_id="call-1", content="found")
            )
        ),
        pb.SessionEventInput(
            message_appended=pb.MessageAppended(
                message=pb.Message(role=pb.ROLE_ASSISTANT, content="x is here")
            )
        ),
    ).events
    request = events[1].sequence  # the cut would fall between the call and its result
    record = _rewind(stub, request)
    assert record.rewound.to_sequence == request - 1
    assert _history(stub, session_id) == ["find x"]
