"""Sessions addressed by an agent framework's own ids (issue 23, server half, item 1):
a lookup that never creates, the user as a component of non-chat routing keys, and
sessions listed by user; on both backends, through real servers."""

from __future__ import annotations

import grpc

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import create_agent
from tests.session.frameworks import adk_source, head, open_adk, refused


def _lookup(service: InProcessSession, source: pb.Source) -> pb.ResolveSessionResponse:
    request = pb.ResolveSessionRequest(agent="main", source=source, lookup_only=True)
    return service.stub.ResolveSession(request)


def test_a_lookup_answers_the_routed_session_or_not_found_and_never_creates(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    before = head(service.stub)

    refused(
        lambda: _lookup(service, adk_source("alice", "s-1")),
        grpc.StatusCode.NOT_FOUND,
        "SESSION_NOT_FOUND",
    )
    assert head(service.stub) == before, "a lookup writes nothing"
    created = open_adk(service.stub, "alice", "s-1")
    found = _lookup(service, adk_source("alice", "s-1"))
    assert (found.session, found.created) == (created, False)
    service.stub.EndSession(pb.EndSessionRequest(agent="main", session_id=created.session_id))
    refused(lambda: _lookup(service, adk_source("alice", "s-1")), grpc.StatusCode.NOT_FOUND)


def test_two_users_equal_conversation_ids_are_two_sessions(service: InProcessSession) -> None:
    create_agent(service.stub)
    alice = open_adk(service.stub, "alice", "s-1")
    bob = open_adk(service.stub, "bob", "s-1")
    nobody = service.stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="main", source=pb.Source(transport="adk", conversation_id="s-1")
        )
    ).session

    assert len({alice.session_id, bob.session_id, nobody.session_id}) == 3
    assert alice.routing_key == "agent:main:adk:u=alice:id=s-1"
    assert nobody.routing_key == "agent:main:adk:id=s-1"
    assert open_adk(service.stub, "alice", "s-1").session_id == alice.session_id
    listed = service.stub.ListSessions(
        pb.ListSessionsRequest(agent="main", user_id="alice", transport="adk")
    )
    assert [session.session_id for session in listed.sessions] == [alice.session_id]
    refused(
        lambda: service.stub.ListSessions(pb.ListSessionsRequest(user_id="alice")),
        grpc.StatusCode.INVALID_ARGUMENT,
    )


def test_a_web_conversation_opened_with_a_user_before_keeps_its_session(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    # As a release before user components stored it: its key without u=.
    old = service.stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="main", source=pb.Source(transport="web", conversation_id="tab-1")
        )
    ).session
    source = pb.Source(transport="web", conversation_id="tab-1", user_id="alice")

    again = service.stub.ResolveSession(pb.ResolveSessionRequest(agent="main", source=source))
    assert (again.session.session_id, again.created) == (old.session_id, False)
    fresh = service.stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="main",
            source=pb.Source(transport="web", conversation_id="tab-2", user_id="alice"),
        )
    ).session
    assert fresh.routing_key == "agent:main:web:u=alice:id=tab-2"


def test_a_bad_user_id_on_a_non_chat_source_is_refused_naming_it(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    before = head(service.stub)
    error = refused(
        lambda: open_adk(service.stub, "../etc", "s-1"), grpc.StatusCode.INVALID_ARGUMENT
    )
    assert "source.user_id" in (error.details() or "")
    assert head(service.stub) == before
