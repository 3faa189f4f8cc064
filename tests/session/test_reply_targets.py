"""What the SessionService keeps of a person's ids beyond the routing: the sealed reply
target on a resume mark (opaque, bounded, in the gateways' envelope, never in clear),
thread ids of redacting agents, and chat sources sent between agents when either of
them redacts. Real servers, both backends."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import grpc
import pytest

from session_service import recovery
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import create_agent, resolve, user_message
from tests.status import error_details, error_reason

KEY = b"reply target tests, 32 bytes ..."
REDACTS = pb.AgentSettings(redact_pii=True)
CHAT, USER, THREAD = "6012345678", "u-5012345678", "4012345678"


def sealed(size: int = 93) -> bytes:
    """Something in the envelope's shape (version 1, nonce, body, tag): the service
    cannot tell it from a real sealing, and need not."""
    return bytes([1]) + os.urandom(size - 1)


def _hmac12(value: str) -> str:
    return hmac.new(KEY, value.encode(), hashlib.sha256).hexdigest()[:12]


def _mark(
    stub: pb_grpc.SessionServiceStub, session_id: str, pending: bool = True, **fields: Any
) -> pb.Session:
    request = pb.MarkResumableRequest(
        agent="main", session_id=session_id, pending=pending, **fields
    )
    return stub.MarkResumable(request).session


def _get(stub: pb_grpc.SessionServiceStub, session_id: str) -> pb.Session:
    return stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id)).session


def _log_size(stub: pb_grpc.SessionServiceStub) -> int:
    return len(stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000)).entries)


@pytest.fixture
def service(database_url: str, loop_thread: EventLoopThread) -> Any:
    with session_server(loop_thread, database_url, pii_key=KEY) as server:
        yield server


# -- the sealed reply target on the mark ------------------------------------------------


def test_the_sealed_target_travels_with_the_mark_and_goes_with_it(
    service: InProcessSession,
) -> None:
    create_agent(service.stub, settings=REDACTS)
    session_id = resolve(service.stub, transport="telegram", chat_type=pb.CHAT_TYPE_DM,
                         chat_id=CHAT).session.session_id  # fmt: skip
    first, second = sealed(), sealed(157)
    assert _mark(service.stub, session_id, holder="gw-a", reply_target=first).reply_target == first
    assert _get(service.stub, session_id).reply_target == first
    [listed] = service.stub.ListResumable(pb.ListResumableRequest(agent="main")).sessions
    assert (listed.session_id, listed.reply_target) == (session_id, first)
    state = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    )
    assert state.state.session.reply_target == first

    # A gateway taking the turn over passes it on (or replaces it): the last mark wins.
    assert _mark(service.stub, session_id, holder="gw-b", reply_target=second).reply_target == (
        second
    )
    assert _mark(service.stub, session_id, holder="gw-c").reply_target == b""
    _mark(service.stub, session_id, reply_target=first)
    cleared = _mark(service.stub, session_id, pending=False, reply_target=second)
    assert (cleared.resume_pending, cleared.reply_target) == (False, b""), "not kept unmarked"
    assert _get(service.stub, session_id).reply_target == b""


def test_the_sealed_target_survives_a_restart_snapshots_a_rebuild_and_rewinds(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    limits = SessionLimits(snapshot_every=2)  # the mark ends up inside a snapshot
    target = sealed()
    with session_server(loop_thread, database_url, limits, pii_key=KEY) as before:
        create_agent(before.stub, settings=REDACTS)
        session_id = resolve(before.stub, transport="web", conversation_id="t").session.session_id
        at = _mark(before.stub, session_id, holder="gw", reply_target=target).last_sequence
        for text in ("one", "two", "three"):
            before.stub.AppendEvents(
                pb.AppendEventsRequest(
                    agent="main", session_id=session_id, events=[user_message(text)]
                )
            )
        marked = _get(before.stub, session_id)
    with session_server(loop_thread, database_url, limits, pii_key=KEY) as after:
        assert _get(after.stub, session_id) == marked and marked.reply_target == target
        report = recovery.rebuild(after.unit.core)
        assert not report.differed, report.differences
        assert _get(after.stub, session_id) == marked, "a replay of the log says the same"
        _mark(after.stub, session_id, pending=False)
        after.stub.Rewind(pb.RewindRequest(sequence=at))
        assert _get(after.stub, session_id).reply_target == target, "the rewind's target's"


@pytest.mark.parametrize(
    ("reply_target", "reason"),
    [
        (sealed(1025), "SEALED_TARGET_TOO_LARGE"),
        (b"6012345678", "SEALED_TARGET_MALFORMED"),  # a chat id in clear
        (
            b'{"chat_id":"6012345678","platform":"telegram","thread_id":""}',
            "SEALED_TARGET_MALFORMED",
        ),
        (bytes([2]) + os.urandom(92), "SEALED_TARGET_MALFORMED"),  # an unknown envelope
        (sealed(29), "SEALED_TARGET_MALFORMED"),  # shorter than nonce + tag + 1 byte
    ],
    ids=["1025 bytes", "digits", "json", "version 2", "29 bytes"],
)
@pytest.mark.parametrize("pending", [True, False], ids=["setting", "clearing"])
def test_an_oversized_or_malformed_target_is_invalid_and_writes_nothing(
    service: InProcessSession, reply_target: bytes, reason: str, pending: bool
) -> None:
    create_agent(service.stub, settings=REDACTS)
    session_id = resolve(service.stub, transport="web", conversation_id="t").session.session_id
    _mark(service.stub, session_id, reply_target=sealed())
    before, logged = _get(service.stub, session_id), _log_size(service.stub)
    with pytest.raises(grpc.RpcError) as refused:
        _mark(service.stub, session_id, pending, reply_target=reply_target)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == reason
    assert error_details(refused.value)[1] == ["reply_target"]
    assert "reply_target" in (refused.value.details() or "")
    assert _get(service.stub, session_id) == before
    assert _log_size(service.stub) == logged


def test_the_largest_target_is_accepted(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, transport="web", conversation_id="t").session.session_id
    assert len(_mark(service.stub, session_id, reply_target=sealed(1024)).reply_target) == 1024


def _post(
    stub: pb_grpc.SessionServiceStub, session_id: str, message_ref: str, **fields: Any
) -> pb.PostToInboxResponse:
    message = pb.Message(role=pb.ROLE_USER, content="hi", sender=USER, message_ref=message_ref)
    request = pb.PostToInboxRequest(agent="main", session_id=session_id, message=message, **fields)
    return stub.PostToInbox(request)


def test_a_post_with_the_mark_keeps_the_sealed_target_and_a_duplicate_keeps_none(
    service: InProcessSession,
) -> None:
    """The gateway's one call: the person's message, the turn's mark and where to answer
    it, stored together; the platform's retry of the message stores none of them."""
    create_agent(service.stub, settings=REDACTS)
    session_id = resolve(service.stub, transport="telegram", chat_type=pb.CHAT_TYPE_DM,
                         chat_id=CHAT).session.session_id  # fmt: skip
    first = sealed()
    posted = _post(
        service.stub,
        session_id,
        "m-1",
        mark_resumable=True,
        resume_holder="gw-a",
        reply_target=first,
    )
    assert not posted.duplicate
    marked = _get(service.stub, session_id)
    assert (marked.resume_pending, marked.resume_holder, marked.reply_target) == (
        True,
        "gw-a",
        first,
    )
    logged = _log_size(service.stub)
    again = _post(
        service.stub,
        session_id,
        "m-1",
        mark_resumable=True,
        resume_holder="gw-b",
        reply_target=sealed(157),
    )
    assert again.duplicate
    assert _get(service.stub, session_id) == marked, "the first delivery's mark and target"
    assert _log_size(service.stub) == logged


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"mark_resumable": True, "reply_target": sealed(1025)}, "SEALED_TARGET_TOO_LARGE"),
        ({"mark_resumable": True, "reply_target": CHAT.encode()}, "SEALED_TARGET_MALFORMED"),
        ({"mark_resumable": True, "reply_target": sealed(29)}, "SEALED_TARGET_MALFORMED"),
        ({"reply_target": sealed()}, "INVALID_FIELD"),
    ],
    ids=["1025 bytes", "digits", "29 bytes", "without mark_resumable"],
)
def test_a_post_with_a_bad_target_is_invalid_and_writes_nothing(
    service: InProcessSession, fields: dict[str, Any], reason: str
) -> None:
    create_agent(service.stub, settings=REDACTS)
    session_id = resolve(service.stub, transport="web", conversation_id="t").session.session_id
    before, logged = _get(service.stub, session_id), _log_size(service.stub)
    with pytest.raises(grpc.RpcError) as refused:
        _post(service.stub, session_id, "m-1", **fields)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[1] == ["reply_target"]
    assert error_reason(refused.value) == reason
    assert _get(service.stub, session_id) == before
    assert _log_size(service.stub) == logged
    assert not _post(service.stub, session_id, "m-1").duplicate, "the message was not taken"


# -- thread ids ---------------------------------------------------------------------------


def test_a_redacting_agent_stores_thread_ids_hashed(service: InProcessSession) -> None:
    create_agent(service.stub, "private", settings=REDACTS)
    create_agent(service.stub, "open")
    topic = {
        "transport": "telegram", "chat_type": pb.CHAT_TYPE_GROUP, "chat_id": "-100" + CHAT,
        "thread_id": THREAD, "user_id": USER,
    }  # fmt: skip
    hashed = resolve(service.stub, "private", **topic)
    assert hashed.session.source.thread_id == f"thread_{_hmac12(THREAD)}"
    assert THREAD not in hashed.session.routing_key
    assert f"thread_{_hmac12(THREAD)}" in hashed.session.routing_key
    again = resolve(service.stub, "private", **topic)
    assert (again.created, again.session.session_id) == (False, hashed.session.session_id)
    other = resolve(service.stub, "private", **{**topic, "thread_id": THREAD + "1"})
    assert other.session.session_id != hashed.session.session_id, "threads stay apart"
    kept = resolve(service.stub, "open", **topic).session
    assert kept.source.thread_id == THREAD and THREAD in kept.routing_key, "as given"


# -- between agents -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sender", "receiver", "hashed"),
    [("private", "open", True), ("open", "private", True), ("open", "open2", False)],
    ids=["from a redacting agent", "into a redacting agent", "neither redacts"],
)
def test_a_chat_source_sent_to_a_peer_is_hashed_when_either_agent_redacts(
    service: InProcessSession, sender: str, receiver: str, hashed: bool
) -> None:
    create_agent(service.stub, "private", settings=REDACTS, peers=["open"])
    create_agent(service.stub, "open", peers=["private", "open2"])
    create_agent(service.stub, "open2")
    asking = resolve(service.stub, sender, transport="web", conversation_id="t").session
    chat = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_DM, chat_id=CHAT, thread_id=THREAD,
        user_id=USER,
    )  # fmt: skip
    message = pb.Message(role=pb.ROLE_USER, content="for you", sender=USER)
    event = service.stub.SendToPeer(
        pb.SendToPeerRequest(
            agent=sender, session_id=asking.session_id, to_agent=receiver, source=chat,
            message=message,
        )
    ).event  # fmt: skip
    got = service.stub.GetSession(
        pb.GetSessionRequest(agent=receiver, session_id=event.session_id)
    ).session
    stored = (got.source.chat_id, got.source.user_id, got.source.thread_id)
    sent = event.inbox_posted.message.sender
    if hashed:
        digests = (
            f"telegram:{_hmac12(CHAT)}",
            f"user_{_hmac12(USER)}",
            f"thread_{_hmac12(THREAD)}",
        )
        assert stored == digests
        assert sent == f"user_{_hmac12(USER)}"
        assert not any(raw in got.routing_key for raw in (CHAT, USER, THREAD))
    else:
        assert (stored, sent) == ((CHAT, USER, THREAD), USER)


# -- message refs -------------------------------------------------------------------------


def test_a_redacting_agent_stores_message_refs_hashed(service: InProcessSession) -> None:
    """Telegram's and Slack's adapters make refs of `<chat id>:<message id>`."""
    create_agent(service.stub, "private", settings=REDACTS, peers=["open"])
    create_agent(service.stub, "open")
    ref = f"{CHAT}:4711"
    hashed = "ref_" + hmac.new(KEY, ref.encode(), hashlib.sha256).hexdigest()[:24]
    for agent, expected in (("private", hashed), ("open", ref)):
        session_id = resolve(service.stub, agent, transport="web", conversation_id="t")
        message = pb.Message(role=pb.ROLE_USER, content="hi", sender=USER, message_ref=ref)
        posted = service.stub.PostToInbox(
            pb.PostToInboxRequest(
                agent=agent, session_id=session_id.session.session_id, message=message
            )
        ).event.inbox_posted.message
        appended = service.stub.AppendEvents(
            pb.AppendEventsRequest(
                agent=agent, session_id=session_id.session.session_id,
                events=[pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))],
            )
        ).events[0].message_appended.message  # fmt: skip
        assert posted.message_ref == appended.message_ref == expected
        history = service.stub.GetHistory(
            pb.GetHistoryRequest(agent=agent, session_id=session_id.session.session_id)
        ).messages
        assert [q.message.message_ref for q in history] == [expected]
    again = pb.Message(role=pb.ROLE_USER, content="again", message_ref=hashed)
    session_id = resolve(service.stub, "private", transport="web", conversation_id="t")
    kept = service.stub.PostToInbox(
        pb.PostToInboxRequest(
            agent="private", session_id=session_id.session.session_id, message=again
        )
    ).event.inbox_posted.message
    assert kept.message_ref == hashed, "a redacted ref is kept as it is"
    # From a redacting agent into one that does not: hashed, as the sender is.
    sent = service.stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="private", session_id=session_id.session.session_id, to_agent="open",
            to_session_id=resolve(service.stub, "open", transport="web",
                                  conversation_id="t").session.session_id,
            message=pb.Message(role=pb.ROLE_USER, content="fwd", message_ref=ref),
        )
    ).event.inbox_posted.message  # fmt: skip
    assert sent.message_ref == hashed
