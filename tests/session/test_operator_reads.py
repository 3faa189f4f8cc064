"""What operators' tools (the console) read and record: audit events with the caller's
principal, rewind records naming theirs, a session's state at a sequence, every
agent's sessions with filters, the newest window of the log with its bounds, and
the checkpoints of a window. Real servers, both backends."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from switchboard.auth import parse_tokens
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import append, create_agent, resolve, user_message, web
from tests.status import error_reason

ADMIN = (("authorization", "Bearer tok-admin"),)
ALICE = (("authorization", "Bearer tok-alice"),)
GRANTS = parse_tokens("tok-admin=admin;tok-alice=agents:alice")


@pytest.fixture
def secured(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url, auth=GRANTS) as server:
        yield server


def _log(stub: pb_grpc.SessionServiceStub, **fields: object) -> pb.ListLogEventsResponse:
    return stub.ListLogEvents(pb.ListLogEventsRequest(**fields), metadata=ADMIN)  # type: ignore[arg-type]


def _admin_agent(stub: pb_grpc.SessionServiceStub, name: str) -> None:
    stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name=name)), metadata=ADMIN)


def _temp(key: str, value: str) -> pb.SessionEventInput:
    return pb.SessionEventInput(
        temp_state_changed=pb.TempStateChanged(set={key: value}),
    )


def test_an_operator_action_is_logged_with_the_callers_principal_and_survives_moves(
    secured: InProcessSession,
) -> None:
    stub = secured.stub
    _admin_agent(stub, "alice")
    session = stub.ResolveSession(
        pb.ResolveSessionRequest(agent="alice", source=pb.Source(**web())), metadata=ALICE
    ).session
    before = (
        stub.AppendEvents(
            pb.AppendEventsRequest(
                agent="alice", session_id=session.session_id, events=[_temp("a", "1")]
            ),
            metadata=ALICE,
        )
        .events[0]
        .sequence
    )
    recorded = stub.RecordOperatorAction(
        pb.RecordOperatorActionRequest(action="delivery.retry", subject="3 rows", detail="ok"),
        metadata=ADMIN,
    ).event
    assert recorded.operator_action == pb.OperatorAction(
        principal="admin", action="delivery.retry", subject="3 rows", detail="ok"
    )
    assert (recorded.agent, recorded.session_id) == ("", "")

    alone = stub.Rewind(pb.RewindRequest(sequence=before), metadata=ADMIN)
    assert alone.unchanged  # the audit record is nobody's event: nothing to abandon
    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="alice", session_id=session.session_id, events=[_temp("b", "2")]
        ),
        metadata=ALICE,
    )
    rewound = stub.Rewind(pb.RewindRequest(sequence=before), metadata=ADMIN)
    assert rewound.record.rewound.principal == "admin"
    assert rewound.summary.abandoned_count == 1
    entries = {e.event.sequence: e for e in _log(stub, event_types=["operator_action"]).entries}
    assert not entries[recorded.sequence].abandoned

    checkout = stub.Checkout(pb.CheckoutRequest(sequence=before - 1), metadata=ADMIN)
    assert checkout.record.rewound.principal == "admin"
    active = _log(stub, branch=pb.LOG_BRANCH_ACTIVE, event_types=["operator_action"]).entries
    assert [e.event.sequence for e in active] == [recorded.sequence]
    # Nothing the audit record did reached a state: the session's fold never saw it.
    state = stub.GetSessionState(
        pb.GetSessionStateRequest(agent="alice", session_id=session.session_id), metadata=ALICE
    )
    assert dict(state.state.temp_state) == {}  # checked out to before the first append


def test_recording_an_action_is_admin_only_and_checks_its_fields(
    secured: InProcessSession,
) -> None:
    stub = secured.stub
    head = _log(stub).head_sequence
    with pytest.raises(grpc.RpcError) as refused:
        stub.RecordOperatorAction(pb.RecordOperatorActionRequest(action="x.y"), metadata=ALICE)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    for request in (
        pb.RecordOperatorActionRequest(action=""),
        pb.RecordOperatorActionRequest(action="Delivery Retry"),
        pb.RecordOperatorActionRequest(action="a", subject="x" * 513),
        pb.RecordOperatorActionRequest(action="a", detail="bell\a"),
    ):
        with pytest.raises(grpc.RpcError) as bad:
            stub.RecordOperatorAction(request, metadata=ADMIN)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _log(stub).head_sequence == head  # nothing written


def test_the_state_at_a_sequence_folds_the_active_events_up_to_it(
    service: InProcessSession,
) -> None:
    stub = service.stub
    create_agent(stub)
    session_id = resolve(stub, **web()).session.session_id
    first = append(stub, session_id, _temp("k", "old"), user_message("hi")).events[-1].sequence
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="m", value="then"))
    middle = append(stub, session_id, _temp("k", "new")).events[-1].sequence
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="m", value="now"))

    def at(sequence: int) -> pb.GetSessionStateResponse:
        return stub.GetSessionState(
            pb.GetSessionStateRequest(agent="main", session_id=session_id, at_sequence=sequence)
        )

    then = at(first)
    assert dict(then.state.temp_state) == {"k": "old"}
    assert then.state.session.message_count == 1
    assert "m" not in then.agent.memory
    assert dict(at(middle).state.temp_state) == {"k": "new"}
    assert dict(at(middle).agent.memory) == {"m": "then"}
    assert dict(at(0).agent.memory) == {"m": "now"}

    # After a rewind to `first`, the abandoned events count for no sequence.
    stub.Rewind(pb.RewindRequest(sequence=first))
    assert dict(at(middle).state.temp_state) == {"k": "old"}

    head = stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=1)).head_sequence
    for sequence, code, reason in (
        (head + 5, grpc.StatusCode.OUT_OF_RANGE, "SEQUENCE_AHEAD_OF_LOG"),
        (1, grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND"),  # before the session existed
    ):
        with pytest.raises(grpc.RpcError) as refused:
            at(sequence)
        assert (refused.value.code(), error_reason(refused.value)) == (code, reason)


def test_sessions_of_every_agent_newest_first_with_filters(secured: InProcessSession) -> None:
    stub = secured.stub
    made = []
    for agent in ("alice", "bob"):
        _admin_agent(stub, agent)
        for tab in ("t1", "t2"):
            made.append(
                stub.ResolveSession(
                    pb.ResolveSessionRequest(agent=agent, source=pb.Source(**web(tab))),
                    metadata=ADMIN,
                ).session
            )

    first = stub.ListSessions(pb.ListSessionsRequest(page_size=3), metadata=ADMIN)
    rest = stub.ListSessions(
        pb.ListSessionsRequest(page_size=3, page_token=first.next_page_token), metadata=ADMIN
    )
    listed = [s.session_id for s in [*first.sessions, *rest.sessions]]
    assert listed == [s.session_id for s in reversed(made)]
    assert not rest.next_page_token

    key = made[2].routing_key  # bob's first tab
    by_key = stub.ListSessions(pb.ListSessionsRequest(routing_key=key), metadata=ADMIN)
    assert [s.session_id for s in by_key.sessions] == [made[2].session_id]
    mine = stub.ListSessions(pb.ListSessionsRequest(agent="alice"), metadata=ALICE)
    assert {s.agent for s in mine.sessions} == {"alice"}

    with pytest.raises(grpc.RpcError) as refused:
        stub.ListSessions(pb.ListSessionsRequest(), metadata=ALICE)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(refused.value) == "AGENT_SCOPE"


def test_the_newest_window_of_the_log_pages_backwards_with_its_bounds(
    service: InProcessSession,
) -> None:
    stub = service.stub
    create_agent(stub)
    session_id = resolve(stub, **web()).session.session_id
    for number in range(6):
        append(stub, session_id, user_message(f"m{number}"))
    everything = [e.event.sequence for e in stub.ListLogEvents(pb.ListLogEventsRequest()).entries]

    top = stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=3))
    assert [e.event.sequence for e in top.entries] == everything[-3:]
    assert (top.head_sequence, top.retained_from) == (everything[-1], 0)
    below = stub.ListLogEvents(
        pb.ListLogEventsRequest(newest=True, page_size=3, page_token=top.next_page_token)
    )
    assert [e.event.sequence for e in below.entries] == everything[-6:-3]
    window = stub.ListLogEvents(
        pb.ListLogEventsRequest(newest=True, page_size=2, before_sequence=everything[3])
    )
    assert [e.event.sequence for e in window.entries] == everything[1:3]


def test_checkpoints_from_a_sequence(service: InProcessSession) -> None:
    stub = service.stub
    create_agent(stub)
    stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="early"))
    session_id = resolve(stub, **web()).session.session_id
    late = append(stub, session_id, user_message("x")).events[0].sequence
    stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="late"))

    listed = stub.ListCheckpoints(pb.ListCheckpointsRequest(min_sequence=late))
    assert [c.label for c in listed.checkpoints] == ["late"]
    every = stub.ListCheckpoints(pb.ListCheckpointsRequest())
    assert [c.label for c in every.checkpoints] == ["early", "late"]
