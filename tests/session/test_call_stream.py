"""SessionService.CallStream: AppendEvents and PostToInbox carried over one stream answer
exactly as their unary twins do (responses, errors with their details, request ids,
scope checks, deadlines), concurrently, and two gateways racing through streams keep
`expected_version` exact."""

from __future__ import annotations

import os
import queue
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.rpc import code_pb2

from switchboard import call_stream
from switchboard.auth import parse_tokens
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.carried import Outcome, carried_outcome, carry, status_of, twins
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import StartSession, create_agent, resolve, user_message, web

GRANTS = parse_tokens("tok-admin-0123=admin;tok-main-0123=agents:main;tok-other-012=agents:other")
ADMIN = (("authorization", "Bearer tok-admin-0123"),)
MAIN = (("authorization", "Bearer tok-main-0123"),)
OTHER = (("authorization", "Bearer tok-other-012"),)
#: Rounds of the stream race; SWITCHBOARD_RACE_ROUNDS=1000 for the long run.
RACE_ROUNDS = int(os.environ.get("SWITCHBOARD_RACE_ROUNDS", "10"))


@pytest.fixture
def secured(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url, auth=GRANTS) as server:
        server.stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="main")), metadata=ADMIN)
        yield server


def _session(stub: pb_grpc.SessionServiceStub, conversation: str) -> str:
    request = pb.ResolveSessionRequest(agent="main", source=pb.Source(**web(conversation)))
    return str(stub.ResolveSession(request, metadata=MAIN).session.session_id)


def _append(session_id: str, text: str, **fields: Any) -> pb.AppendEventsRequest:
    return pb.AppendEventsRequest(
        agent="main", session_id=session_id, events=[user_message(text)], **fields
    )


def _twins(
    server: InProcessSession, kind: str, request: Message, metadata: Any = MAIN
) -> tuple[Outcome, Outcome]:
    return twins(server.stub, pb.CallStreamRequest, kind, request, metadata)


def test_an_append_carried_then_retried_unary_by_its_request_id_answers_the_same(
    secured: InProcessSession,
) -> None:
    session_id = _session(secured.stub, "tab-1")
    request = _append(session_id, "hello", request_id=str(uuid.uuid4()))
    carried, unary = _twins(secured, "append_events", request)
    assert carried[0] == "ok" and carried == unary
    history = secured.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id), metadata=MAIN
    )
    assert [m.message.content for m in history.messages] == ["hello"], "written exactly once"


def test_a_post_carried_answers_as_its_unary_retry(secured: InProcessSession) -> None:
    session_id = _session(secured.stub, "tab-2")
    message = pb.Message(role=pb.ROLE_USER, content="from the inbox")
    request = pb.PostToInboxRequest(
        agent="main", session_id=session_id, message=message, request_id=str(uuid.uuid4())
    )
    carried, unary = _twins(secured, "post_to_inbox", request)
    assert carried[0] == "ok" and carried == unary


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("no events", code_pb2.INVALID_ARGUMENT),
        ("another agent's scope", code_pb2.PERMISSION_DENIED),
        ("a stale expected_version", code_pb2.ABORTED),
        ("no such session", code_pb2.NOT_FOUND),
    ],
)
def test_each_error_is_the_unary_one(secured: InProcessSession, name: str, code: int) -> None:
    session_id = _session(secured.stub, "tab-errors")
    metadata = MAIN
    request = _append(session_id, "hi")
    if name == "no events":
        del request.events[:]
    elif name == "another agent's scope":
        metadata = OTHER
    elif name == "a stale expected_version":
        request.expected_version = 99
    else:
        request.session_id = "no-such-session"
    carried, unary = _twins(secured, "append_events", request, metadata)
    assert status_of(carried).code == code
    assert carried == unary, "the same code, message and details"


def test_a_request_id_reused_for_another_request_is_refused_as_unary(
    secured: InProcessSession,
) -> None:
    session_id = _session(secured.stub, "tab-reuse")
    request_id = str(uuid.uuid4())
    secured.stub.AppendEvents(_append(session_id, "first", request_id=request_id), metadata=MAIN)
    carried, unary = _twins(
        secured, "append_events", _append(session_id, "second", request_id=request_id)
    )
    assert carried[0] == "error" and carried == unary


def test_a_stream_without_a_valid_token_ends_unauthenticated(secured: InProcessSession) -> None:
    request = pb.CallStreamRequest(append_events=_append("any", "hi"))
    for metadata in ((), (("authorization", "Bearer wrong-token"),)):
        with pytest.raises(grpc.RpcError) as refused:
            list(secured.stub.CallStream(iter([request]), metadata=metadata))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_request_without_a_call_names_the_field(secured: InProcessSession) -> None:
    (answer,) = secured.stub.CallStream(
        iter([pb.CallStreamRequest(correlation_id=7)]), metadata=MAIN
    )
    assert answer.correlation_id == 7
    status = status_of(carried_outcome(answer))
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message.startswith("call:")


def test_a_call_past_its_own_timeout_is_answered_deadline_exceeded_and_not_written(
    secured: InProcessSession,
) -> None:
    session_id = _session(secured.stub, "tab-late")
    late = pb.CallStreamRequest(
        append_events=_append(session_id, "late"), timeout=Duration(nanos=1)
    )
    on_time = pb.CallStreamRequest(correlation_id=1, append_events=_append(session_id, "ok"))
    answers = {
        a.correlation_id: a for a in secured.stub.CallStream(iter([late, on_time]), metadata=MAIN)
    }
    assert status_of(carried_outcome(answers[0])).code == code_pb2.DEADLINE_EXCEEDED
    assert answers[1].WhichOneof("result") == "append_events"
    history = secured.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id), metadata=MAIN
    )
    assert [m.message.content for m in history.messages] == ["ok"]


def test_many_carried_appends_race_on_one_version_and_exactly_one_wins(
    service: InProcessSession,
) -> None:
    create_agent(service.stub, "main")
    session = resolve(service.stub, **web("race")).session
    calls = [
        (
            "append_events",
            _append(session.session_id, f"racer {n}", expected_version=session.version),
        )
        for n in range(16)
    ]
    answers = carry(service.stub.CallStream, pb.CallStreamRequest, calls)
    kinds = [answer.WhichOneof("result") for answer in answers]
    assert kinds.count("append_events") == 1
    assert all(
        status_of(carried_outcome(a)).code == code_pb2.ABORTED
        for a in answers
        if a.WhichOneof("result") == "error"
    )


def test_gateways_racing_through_streams_keep_versions_exact(
    start_session: StartSession,
) -> None:
    """Three servers on one database, a stream to each; each round 8 appends on the
    same expected_version, spread over the streams (so the writers batch them): one
    wins per round, and the session has one event per round. SWITCHBOARD_RACE_ROUNDS
    sets the rounds (1,000 for the long run)."""
    servers = [start_session() for _ in range(3)]
    create_agent(servers[0].stub, "main")
    session_id = resolve(servers[0].stub, **web("three-gateways")).session.session_id
    version = (
        servers[0]
        .stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id))
        .session.version
    )
    with ThreadPoolExecutor(len(servers)) as pool:
        for round_number in range(RACE_ROUNDS):
            calls = [
                (
                    "append_events",
                    _append(session_id, f"r{round_number} c{c}", expected_version=version),
                )
                for c in range(8)
            ]
            results = list(
                pool.map(
                    lambda pair: carry(pair[0].stub.CallStream, pb.CallStreamRequest, pair[1]),
                    [(server, calls[n :: len(servers)]) for n, server in enumerate(servers)],
                )
            )
            answers = [a for batch in results for a in batch]
            won = [a for a in answers if a.WhichOneof("result") == "append_events"]
            assert len(won) == 1, f"round {round_number}: {len(won)} winners"
            lost = {a.error.code for a in answers if a.WhichOneof("result") == "error"}
            assert lost == {code_pb2.ABORTED}, f"round {round_number}: {lost}"
            version = won[0].append_events.version
    state = servers[1].stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    )
    assert state.state.session.message_count == RACE_ROUNDS


def test_a_draining_server_answers_the_calls_in_flight_and_ends_its_streams(
    service: InProcessSession, loop_thread: EventLoopThread
) -> None:
    """What a stopping server does: its open streams end (OK) once the calls they carry
    are answered, without waiting for their callers to half-close; new ones end at once."""
    create_agent(service.stub, "main")
    session_id = resolve(service.stub, **web("draining")).session.session_id
    outgoing: queue.SimpleQueue[pb.CallStreamRequest | None] = queue.SimpleQueue()

    def feed() -> Iterator[pb.CallStreamRequest]:
        while (request := outgoing.get()) is not None:
            yield request

    answers = service.stub.CallStream(feed(), timeout=20)
    outgoing.put(pb.CallStreamRequest(append_events=_append(session_id, "before")))
    assert next(answers).WhichOneof("result") == "append_events"
    loop_thread.loop.call_soon_threadsafe(service.unit.servicer.carried.drain)
    assert list(answers) == [], "the stream ended without the caller half-closing"
    outgoing.put(None)
    late = pb.CallStreamRequest(append_events=_append(session_id, "after"))
    assert list(service.stub.CallStream(iter([late]))) == []
    history = service.stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=session_id))
    assert [m.message.content for m in history.messages] == ["before"]


def test_past_its_bound_of_calls_in_flight_a_stream_reads_on_as_calls_finish(
    service: InProcessSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(call_stream, "MAX_CALLS_IN_FLIGHT", 1)
    create_agent(service.stub, "main")
    session_id = resolve(service.stub, **web("bounded")).session.session_id
    calls = [("append_events", _append(session_id, f"m{n}")) for n in range(10)]
    answers = carry(service.stub.CallStream, pb.CallStreamRequest, calls, timeout=30)
    assert all(answer.WhichOneof("result") == "append_events" for answer in answers)
