"""RetractMessages (issue 23, server half, item 2): a retraction is an event of the log,
versioned like any turn change, that takes messages out of the history and the
message count, and that rewinds and checkouts move like any other event; on both
backends, through real servers."""

from __future__ import annotations

from typing import Any

import grpc

from session_service import recovery
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import append, create_agent, resolve, user_message, web
from tests.session.frameworks import head, refused, version


def _said(service: InProcessSession, session_id: str, agent: str = "main") -> list[str]:
    history = service.stub.GetHistory(
        pb.GetHistoryRequest(agent=agent, session_id=session_id, limit=1000)
    )
    return [item.message.content for item in history.messages]


def _retract(
    service: InProcessSession, session_id: str, **fields: Any
) -> pb.RetractMessagesResponse:
    request = pb.RetractMessagesRequest(agent="main", session_id=session_id, **fields)
    return service.stub.RetractMessages(request)


def _count(service: InProcessSession, session_id: str) -> int:
    got = service.stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id))
    return int(got.session.message_count)


def _conversation(service: InProcessSession, *texts: str) -> tuple[str, list[int]]:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    answer = append(service.stub, session_id, *[user_message(text) for text in texts])
    return session_id, [event.sequence for event in answer.events]


def test_retracting_the_newest_message_answers_it_and_takes_it_out_of_the_history(
    service: InProcessSession,
) -> None:
    session_id, _ = _conversation(service, "one", "two", "three")
    before = version(service.stub, session_id)

    popped = _retract(service, session_id, newest_count=1, expected_version=before)

    assert [m.message.content for m in popped.messages] == ["three"]
    assert popped.version == before + 1 == version(service.stub, session_id)
    assert popped.session_id == session_id and popped.sequence == head(service.stub)
    assert _said(service, session_id) == ["one", "two"]
    assert _count(service, session_id) == 2
    two = _retract(service, session_id, newest_count=5)
    assert [m.message.content for m in two.messages] == ["one", "two"]
    assert _said(service, session_id) == [] and _count(service, session_id) == 0
    written = head(service.stub)
    empty = _retract(service, session_id, newest_count=1)
    assert (list(empty.messages), empty.sequence) == ([], 0)
    assert head(service.stub) == written, "nothing to retract: nothing written"


def test_a_stale_version_or_a_message_not_in_the_history_is_refused_and_writes_nothing(
    service: InProcessSession,
) -> None:
    session_id, sequences = _conversation(service, "one", "two")
    other = resolve(service.stub, **web("tab-2")).session.session_id
    foreign = append(service.stub, other, user_message("elsewhere")).events[0].sequence
    before = head(service.stub)
    stale = version(service.stub, session_id) - 1

    refused(
        lambda: _retract(service, session_id, newest_count=1, expected_version=stale),
        grpc.StatusCode.ABORTED,
        "VERSION_MISMATCH",
    )
    for bad in ([foreign], [sequences[0], sequences[0] + 1000]):
        refused(
            lambda: _retract(service, session_id, sequences=bad),  # noqa: B023
            grpc.StatusCode.FAILED_PRECONDITION,
            "MESSAGE_NOT_IN_HISTORY",
        )
    for fields in ({}, {"newest_count": 1, "sequences": [sequences[0]]}, {"newest_count": 101}):
        refused(lambda: _retract(service, session_id, **fields), grpc.StatusCode.INVALID_ARGUMENT)  # noqa: B023
    assert head(service.stub) == before
    assert _said(service, session_id) == ["one", "two"]
    done = _retract(service, session_id, sequences=[sequences[0]])
    assert [m.sequence for m in done.messages] == [sequences[0]]
    assert _said(service, session_id) == ["two"]


def test_a_rewind_past_the_retraction_brings_the_messages_back_and_a_checkout_retracts_again(
    service: InProcessSession,
) -> None:
    session_id, sequences = _conversation(service, "one", "two")
    popped = _retract(service, session_id, newest_count=1)

    service.stub.Rewind(pb.RewindRequest(sequence=sequences[-1]))
    assert _said(service, session_id) == ["one", "two"] and _count(service, session_id) == 2
    service.stub.Checkout(pb.CheckoutRequest(sequence=popped.sequence))
    assert _said(service, session_id) == ["one"] and _count(service, session_id) == 1
    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences
    assert _said(service, session_id) == ["one"]


def test_a_fork_keeps_what_its_parent_retracts_later_and_retracts_its_own_alone(
    service: InProcessSession,
) -> None:
    session_id, _ = _conversation(service, "one", "two")
    fork = service.stub.ForkSession(
        pb.ForkSessionRequest(agent="main", session_id=session_id)
    ).session

    _retract(service, session_id, newest_count=1)
    assert _said(service, fork.session_id) == ["one", "two"]
    inherited = _retract(service, fork.session_id, newest_count=1)
    assert [m.message.content for m in inherited.messages] == ["two"]
    assert _said(service, fork.session_id) == ["one"]
    assert _said(service, session_id) == ["one"]
    assert _count(service, fork.session_id) == 1
