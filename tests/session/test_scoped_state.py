"""Scoped state (issue 23, server half, item 3): session, user and agent state changed
by atomic deltas with an append or alone, read with the session and per user, moved
by rewinds and checkouts, rebuilt by rebuild and kept across truncation; on both
backends, through real servers."""

from __future__ import annotations

from typing import Any

import grpc

from session_service import recovery
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, create_agent, user_message
from tests.session.frameworks import (
    AGENT,
    SESSION,
    USER,
    decoded,
    delta,
    head,
    open_adk,
    refused,
    version,
)


def _append(
    service: InProcessSession, session_id: str, *deltas: pb.StateDelta, **fields: Any
) -> pb.AppendEventsResponse:
    events = fields.pop("events", [user_message("hi")])
    request = pb.AppendEventsRequest(
        agent="main", session_id=session_id, events=events, state_deltas=deltas, **fields
    )
    return service.stub.AppendEvents(request)


def _scoped(service: InProcessSession, session_id: str, at: int = 0) -> pb.ScopedState:
    request = pb.GetSessionStateRequest(agent="main", session_id=session_id, at_sequence=at)
    return service.stub.GetSessionState(request).scoped_state


def test_deltas_of_every_scope_apply_with_the_append_and_read_with_the_session(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session = open_adk(service.stub, "alice", "s-1")
    answer = _append(
        service,
        session.session_id,
        delta(SESSION, topic="trains", count=1),
        delta(USER, lang="fr"),
        delta(AGENT, model={"name": "m", "t": 0.5}),
    )

    assert len(answer.events) == 4 and len(answer.sequences) == 4
    kinds = [event.WhichOneof("body") for event in answer.events]
    assert kinds == ["message_appended", *["state_changed"] * 3]
    assert answer.version == session.version + 2, "the message and the session delta"
    assert [bool(event.session_id) for event in answer.events] == [True, True, False, False]
    scoped = _scoped(service, session.session_id)
    assert decoded(scoped.session) == {"topic": "trains", "count": 1}
    assert decoded(scoped.user) == {"lang": "fr"}
    assert decoded(scoped.agent) == {"model": {"name": "m", "t": 0.5}}
    assert scoped.user_id == "alice"
    got = service.stub.GetSession(
        pb.GetSessionRequest(agent="main", session_id=session.session_id, include_state=True)
    )
    assert got.scoped_state == scoped and got.session.version == answer.version
    plain = service.stub.GetSession(
        pb.GetSessionRequest(agent="main", session_id=session.session_id)
    )
    assert not plain.HasField("scoped_state")
    user = service.stub.GetUserState(pb.GetUserStateRequest(agent="main", user_id="alice"))
    assert decoded(user.state) == {"lang": "fr"} and user.user_id == "alice"


def test_user_and_agent_state_are_shared_and_never_conflict_with_a_sessions_version(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    first = open_adk(service.stub, "alice", "s-1")
    second = open_adk(service.stub, "alice", "s-2")
    other = open_adk(service.stub, "bob", "s-1")
    assert len({first.session_id, second.session_id, other.session_id}) == 3

    updated = service.stub.UpdateState(
        pb.UpdateStateRequest(
            agent="main",
            session_id=first.session_id,
            deltas=[delta(USER, seen=3), delta(AGENT, greeting="hello")],
        )
    )

    assert updated.version == first.version, "no SESSION delta: the session's version stays"
    assert version(service.stub, first.session_id) == first.version
    assert decoded(_scoped(service, second.session_id).user) == {"seen": 3}
    assert decoded(_scoped(service, other.session_id).user) == {}
    assert decoded(_scoped(service, other.session_id).agent) == {"greeting": "hello"}
    # An append expecting the version read before the user-state write still goes through.
    _append(service, first.session_id, expected_version=first.version)
    # State without a session: the agent's, and a user's named by id.
    service.stub.UpdateState(
        pb.UpdateStateRequest(
            agent="main", deltas=[delta(USER, user_id="bob", seen=1), delta(AGENT, ("greeting",))]
        )
    )
    assert decoded(_scoped(service, other.session_id).user) == {"seen": 1}
    assert decoded(_scoped(service, first.session_id).agent) == {}


def test_bad_deltas_are_refused_naming_the_field_and_write_nothing(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session = open_adk(service.stub, "alice", "s-1")
    spawned = service.stub.SpawnSession(pb.SpawnSessionRequest(agent="main")).session
    before = head(service.stub)
    not_json = pb.StateDelta(scope=SESSION, set={"k": "not json"})
    cases = [
        (session.session_id, not_json, "state_deltas[0].set['k']"),
        (session.session_id, pb.StateDelta(set={"k": "1"}), "state_deltas[0].scope"),
        (session.session_id, delta(SESSION, user_id="x", k=1), "state_deltas[0].user_id"),
        (session.session_id, pb.StateDelta(scope=SESSION), "state_deltas[0]"),
        (session.session_id, delta(SESSION, ("k",), k=1), "state_deltas[0].removed"),
        (session.session_id, pb.StateDelta(scope=SESSION, set={"": "1"}), "state_deltas[0]['']"),
        (spawned.session_id, delta(USER, k=1), "state_deltas[0].user_id"),
    ]
    for session_id, bad, field in cases:
        error = refused(lambda: _append(service, session_id, bad), grpc.StatusCode.INVALID_ARGUMENT)  # noqa: B023
        assert field in (error.details() or ""), (field, error.details())
    sessionless = pb.UpdateStateRequest(agent="main", deltas=[delta(SESSION, k=1)])
    refused(lambda: service.stub.UpdateState(sessionless), grpc.StatusCode.INVALID_ARGUMENT)
    assert head(service.stub) == before
    assert decoded(_scoped(service, session.session_id).session) == {}


def test_values_and_an_owners_total_are_bounded_and_a_deployment_can_raise_the_value_limit(
    start_session: StartSession,
) -> None:
    service = start_session(SessionLimits(max_state_value_bytes=64))
    create_agent(service.stub)
    session = open_adk(service.stub, "alice", "s-1")

    refused(
        lambda: _append(service, session.session_id, delta(SESSION, big="x" * 70)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "STATE_VALUE_TOO_LARGE",
    )
    _append(service, session.session_id, delta(SESSION, small="x" * 60))
    raised = start_session(SessionLimits(max_state_value_bytes=600 * 1024))
    big = "x" * (500 * 1024)
    _append(raised, session.session_id, delta(SESSION, a=big))
    before = head(raised.stub)
    refused(
        lambda: _append(raised, session.session_id, delta(SESSION, b=big, c=big)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "STATE_TOO_LARGE",
    )
    assert head(raised.stub) == before
    assert set(_scoped(raised, session.session_id).session) == {"small", "a"}


def test_a_rewind_and_a_checkout_refold_the_owners_whose_changes_they_move(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session = open_adk(service.stub, "alice", "s-1")
    first = _append(service, session.session_id, delta(SESSION, n=1), delta(USER, u=1))
    cut = first.sequences[-1]
    changes = (delta(SESSION, ("n",), m=2), delta(USER, u=2), delta(AGENT, a=1))
    second = _append(service, session.session_id, *changes)

    service.stub.Rewind(pb.RewindRequest(sequence=cut))
    scoped = _scoped(service, session.session_id)
    assert (decoded(scoped.session), decoded(scoped.user), decoded(scoped.agent)) == (
        {"n": 1},
        {"u": 1},
        {},
    )
    service.stub.Checkout(pb.CheckoutRequest(sequence=second.sequences[-1]))
    scoped = _scoped(service, session.session_id)
    assert (decoded(scoped.session), decoded(scoped.user), decoded(scoped.agent)) == (
        {"m": 2},
        {"u": 2},
        {"a": 1},
    )
    past = _scoped(service, session.session_id, at=cut)
    assert (decoded(past.session), decoded(past.user)) == ({"n": 1}, {"u": 1})
    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences


def test_scoped_state_survives_truncation_of_the_events_it_was_folded_from(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session = open_adk(service.stub, "alice", "s-1")
    _append(service, session.session_id, delta(SESSION, n=1), delta(USER, u=1))
    answer = _append(service, session.session_id, delta(SESSION, m=2))
    stub = service.stub
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=session.session_id))
    below = head(stub)
    later = _append(service, session.session_id, delta(SESSION, ("m",), k=3))
    stub.TruncateLog(pb.TruncateLogRequest(below_sequence=below))

    stub.Rewind(pb.RewindRequest(sequence=answer.sequences[-1] + 1))  # refolds the owners
    assert decoded(_scoped(service, session.session_id).session) == {"n": 1, "m": 2}
    stub.Checkout(pb.CheckoutRequest(sequence=later.sequences[-1]))
    assert decoded(_scoped(service, session.session_id).session) == {"n": 1, "k": 3}
    assert decoded(_scoped(service, session.session_id).user) == {"u": 1}


def test_a_redacting_agent_keeps_user_state_under_the_hashed_user(
    service: InProcessSession,
) -> None:
    create_agent(service.stub, settings=pb.AgentSettings(redact_pii=True))
    session = open_adk(service.stub, "alice", "s-1")
    assert session.source.user_id.startswith("user_") and "alice" not in session.routing_key
    _append(service, session.session_id, delta(USER, lang="fr"))
    service.stub.UpdateState(
        pb.UpdateStateRequest(agent="main", deltas=[delta(USER, user_id="alice", tz="CET")])
    )

    got = service.stub.GetUserState(pb.GetUserStateRequest(agent="main", user_id="alice"))
    assert decoded(got.state) == {"lang": "fr", "tz": "CET"}
    assert got.user_id == session.source.user_id
    listed = service.stub.ListSessions(pb.ListSessionsRequest(agent="main", user_id="alice"))
    assert [s.session_id for s in listed.sessions] == [session.session_id]
