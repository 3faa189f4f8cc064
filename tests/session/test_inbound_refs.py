"""One platform message, one inbox post: a session accepts one post per message_ref.

A platform retries (Slack re-sends an event, Telegram hands an update out again) and
several gateway instances may receive one update: whatever reaches the service first
is posted, every later post of that message_ref writes nothing and answers the first
post's event, marked `duplicate`. The rule is the database's (a unique index on the
log's active inbox posts, checked under the log's write lock), so it holds across
writer threads and replicas; it belongs to the timeline (a rewind frees a ref, a
checkout restores it) and lives as long as the post that accepted the message.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import grpc
import peewee
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web
from tests.status import error_details

RACERS = 8
#: Rounds of the race; SWITCHBOARD_RACE_ROUNDS=300 for a long run (as test_concurrency).
ROUNDS = int(os.environ.get("SWITCHBOARD_RACE_ROUNDS", "10"))


def _post(
    stub: pb_grpc.SessionServiceStub,
    session_id: str,
    message_ref: str,
    content: str = "hello",
    sender: str = "u1",
    agent: str = "main",
    **request: Any,
) -> pb.PostToInboxResponse:
    message = pb.Message(role=pb.ROLE_USER, content=content, sender=sender, message_ref=message_ref)
    return stub.PostToInbox(
        pb.PostToInboxRequest(agent=agent, session_id=session_id, message=message, **request)
    )


def _log(stub: pb_grpc.SessionServiceStub) -> list[pb.Event]:
    """The whole log, abandoned events included (the logs here are short)."""
    page = stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000))
    assert not page.next_page_token
    return [entry.event for entry in page.entries]


def _inbox(stub: pb_grpc.SessionServiceStub, session_id: str, agent: str = "main") -> list[str]:
    request = pb.GetSessionStateRequest(agent=agent, session_id=session_id)
    return [q.message.content for q in stub.GetSessionState(request).state.inbox]


@pytest.fixture
def chat(service: InProcessSession) -> tuple[pb_grpc.SessionServiceStub, str]:
    create_agent(service.stub)
    return service.stub, resolve(service.stub, **web()).session.session_id


def test_a_message_ref_posted_again_writes_nothing_and_answers_the_first_post(
    chat: tuple[pb_grpc.SessionServiceStub, str],
) -> None:
    stub, session_id = chat
    first = _post(stub, session_id, "slack:C1:171.001")
    assert not first.duplicate
    logged = _log(stub)
    # A retry, even one whose other fields differ: the message is the platform's.
    again = _post(stub, session_id, "slack:C1:171.001", content="hello?", sender="u2")
    assert again.duplicate
    assert again.event == first.event, "the first post's event, same sequence"
    assert _log(stub) == logged, "nothing written"
    assert _inbox(stub, session_id) == ["hello"]

    assert not _post(stub, session_id, "slack:C1:171.002", content="next").duplicate
    for _ in range(2):  # no message_ref: no such rule, as before
        assert not _post(stub, session_id, "", content="unreferenced").duplicate
    other = resolve(stub, **web("tab-2")).session.session_id
    elsewhere = _post(stub, other, "slack:C1:171.001")
    assert not elsewhere.duplicate, "one post per message_ref per session"
    assert _inbox(stub, session_id) == ["hello", "next", "unreferenced", "unreferenced"]


def _mark(stub: pb_grpc.SessionServiceStub, session_id: str) -> tuple[bool, str]:
    session = stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id)).session
    return session.resume_pending, session.resume_holder


def test_a_post_sets_the_resume_mark_in_its_transaction_and_a_duplicate_sets_none(
    chat: tuple[pb_grpc.SessionServiceStub, str],
) -> None:
    """How a gateway starts a turn: its message and its mark are stored together, so a
    crash never leaves one without the other; a second delivery of the message (another
    instance's) writes neither, and the turn stays the first instance's."""
    stub, session_id = chat
    first = _post(stub, session_id, "m-1", mark_resumable=True, resume_holder="gw-a")
    *_, marked, posted = _log(stub)
    assert (marked.WhichOneof("body"), marked.resume_marked.holder) == ("resume_marked", "gw-a")
    assert (marked.sequence + 1, posted) == (first.event.sequence, first.event)
    assert _mark(stub, session_id) == (True, "gw-a")

    logged = _log(stub)
    again = _post(stub, session_id, "m-1", mark_resumable=True, resume_holder="gw-b")
    assert (again.duplicate, again.event) == (True, first.event)
    assert _mark(stub, session_id) == (True, "gw-a"), "the turn is still the first's"
    assert _log(stub) == logged

    stub.MarkResumable(pb.MarkResumableRequest(agent="main", session_id=session_id))
    _post(stub, session_id, "m-1", mark_resumable=True, resume_holder="gw-b")
    assert _mark(stub, session_id) == (False, ""), "a retry after the turn marks nothing"


@pytest.mark.parametrize(
    ("mark", "holder"),
    [(True, "../gw"), (True, "g" * 129), (True, "gw\x07"), (False, "gw-a")],
    ids=["a path", "too long", "a control character", "a holder without a mark"],
)
def test_a_bad_resume_holder_is_refused_and_writes_nothing(
    chat: tuple[pb_grpc.SessionServiceStub, str], mark: bool, holder: str
) -> None:
    stub, session_id = chat
    logged = _log(stub)
    with pytest.raises(grpc.RpcError) as refused:
        _post(stub, session_id, "m-1", mark_resumable=mark, resume_holder=holder)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[1] == ["resume_holder"]
    assert _log(stub) == logged


def _race(calls: Sequence[Callable[[], Any]]) -> list[Any]:
    """Runs the calls at the same moment; each answer or the RpcError it raised."""
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        start.wait()
        try:
            return call()
        except grpc.RpcError as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_posts_racing_with_one_message_ref_through_two_replicas_accept_exactly_one(
    start_session: StartSession,
) -> None:
    """On Postgres two servers with their own pools and writer threads; on SQLite two
    servers on one file. Each racer has a channel of its own."""
    replicas = [start_session() for _ in range(2)]
    create_agent(replicas[0].stub)
    session_id = resolve(replicas[0].stub, **web()).session.session_id
    channels = [grpc.insecure_channel(replicas[n % 2].address) for n in range(RACERS)]
    stubs = [pb_grpc.SessionServiceStub(channel) for channel in channels]
    try:
        for round_number in range(ROUNDS):
            ref = f"update-{round_number}"
            answers = _race(
                [partial(_post, stub, session_id, ref, f"try {n}") for n, stub in enumerate(stubs)]
            )
            failed = [answer for answer in answers if isinstance(answer, grpc.RpcError)]
            assert not failed, failed
            accepted = [answer for answer in answers if not answer.duplicate]
            assert len(accepted) == 1, f"round {round_number}: {len(accepted)} accepted"
            assert {answer.event.SerializeToString() for answer in answers} == {
                accepted[0].event.SerializeToString()
            }, "every duplicate answers the one accepted post"
    finally:
        for channel in channels:
            channel.close()
    posts = [e for e in _log(replicas[1].stub) if e.WhichOneof("body") == "inbox_posted"]
    assert sorted(e.inbox_posted.message.message_ref for e in posts) == sorted(
        f"update-{n}" for n in range(ROUNDS)
    )


def test_a_rewind_past_a_post_frees_its_message_ref_and_a_checkout_restores_it(
    chat: tuple[pb_grpc.SessionServiceStub, str],
) -> None:
    stub, session_id = chat
    before = stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="before")).checkpoint
    first = _post(stub, session_id, "m-1", "first life")
    stub.Rewind(pb.RewindRequest(checkpoint="before"))
    assert _inbox(stub, session_id) == []

    again = _post(stub, session_id, "m-1", "second life")
    assert not again.duplicate, "the rewound-away post counts for nothing"
    assert again.event.sequence > first.event.sequence
    assert _post(stub, session_id, "m-1").event == again.event
    assert _inbox(stub, session_id) == ["second life"]

    # Back onto the first post's branch: it counts again, the second post does not.
    stub.Checkout(pb.CheckoutRequest(sequence=first.event.sequence))
    assert _inbox(stub, session_id) == ["first life"]
    repeat = _post(stub, session_id, "m-1", "third try")
    assert (repeat.duplicate, repeat.event) == (True, first.event)
    assert before.sequence < first.event.sequence


def test_a_post_truncated_away_no_longer_holds_its_message_ref(
    chat: tuple[pb_grpc.SessionServiceStub, str],
) -> None:
    """The rule lives as long as the event that accepted the message: bounded growth."""
    stub, session_id = chat
    _post(stub, session_id, "m-1", "kept in the snapshot")
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=session_id))
    [tail] = append(stub, session_id, user_message("tail")).events
    deleted = stub.TruncateLog(pb.TruncateLogRequest(below_sequence=tail.sequence))
    assert deleted.deleted_count > 0
    anew = _post(stub, session_id, "m-1", "after truncation")
    assert not anew.duplicate
    assert _inbox(stub, session_id) == ["kept in the snapshot", "after truncation"]


def test_the_database_refuses_a_second_active_post_of_a_message_ref(
    service: InProcessSession,
) -> None:
    """The index holds the rule even for a writer that skipped the check."""
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    _post(service.stub, session_id, "m-1")
    store: Any = service.unit.store
    copy = (
        "INSERT INTO session_log (seq, agent, session_id, kind, format, payload, active, "
        "inbound_ref) SELECT seq + 1000, agent, session_id, kind, format, payload, ?, "
        "inbound_ref FROM session_log WHERE inbound_ref = ?"
    )
    with store.database.connection_context():
        with pytest.raises(peewee.IntegrityError), store.database.atomic():
            store.database.execute_sql(store.tables.sql(copy), [True, "m-1"])
        # An abandoned copy is no second acceptance.
        with store.database.atomic():
            store.database.execute_sql(store.tables.sql(copy), [False, "m-1"])


@pytest.fixture
def team(service: InProcessSession) -> InProcessSession:
    create_agent(service.stub, "coder")
    create_agent(service.stub, "router", peers=["coder"])
    return service


def test_send_to_peer_and_delegate_post_a_message_ref_once(team: InProcessSession) -> None:
    """A router agent forwarding a platform's message twice (its own retry) posts it once."""
    stub = team.stub
    routing = resolve(stub, "router", **web()).session.session_id
    forwarded = pb.Message(role=pb.ROLE_USER, content="fix the build", message_ref="tg:99:7")
    target = pb.Source(transport="peer", conversation_id="router:chat")
    sends = [
        stub.SendToPeer(
            pb.SendToPeerRequest(
                agent="router", session_id=routing, to_agent="coder", source=target,
                message=forwarded,
            )
        )
        for _ in range(2)
    ]  # fmt: skip
    assert [send.duplicate for send in sends] == [False, True]
    assert sends[1].event == sends[0].event
    assert _inbox(stub, sends[0].event.session_id, "coder") == ["fix the build"]

    task = pb.Message(role=pb.ROLE_USER, content="write the parser", message_ref="ticket-7")
    delegations = [
        stub.Delegate(
            pb.DelegateRequest(
                agent="router", session_id=routing, to_agent="coder", task=task, context="t7"
            )
        )
        for _ in range(2)
    ]
    assert [(d.created, d.duplicate) for d in delegations] == [(True, False), (False, True)]
    delegated = delegations[0].session.session_id
    assert _inbox(stub, delegated, "coder") == ["write the parser"]


def test_a_redacting_agents_repeat_is_caught_by_its_hashed_ref(service: InProcessSession) -> None:
    """A redacting agent stores the ref hashed (ref_<24 hex>): a repeat is compared in
    that stored form, so it writes nothing, as for any agent."""
    stub = service.stub
    create_agent(stub, settings=pb.AgentSettings(redact_pii=True))
    dm: dict[str, Any] = {
        "transport": "telegram",
        "chat_type": pb.CHAT_TYPE_DM,
        "chat_id": "7012345678",
    }
    session_id = resolve(stub, **dm).session.session_id
    first = _post(stub, session_id, "7012345678:55", mark_resumable=True)
    stored_ref = first.event.inbox_posted.message.message_ref
    assert stored_ref.startswith("ref_") and "7012345678" not in stored_ref
    logged = _log(stub)
    again = _post(stub, session_id, "7012345678:55", mark_resumable=True)
    assert again.duplicate and again.event == first.event
    assert _log(stub) == logged, "nothing written, no second mark"
    assert _inbox(stub, session_id) == ["hello"]


def test_a_peer_message_redacted_by_its_sender_is_posted_once(service: InProcessSession) -> None:
    """Between agents the ref is hashed when either agent redacts: the sender here, not
    the receiver. SendToPeer's and Delegate's repeats are caught all the same."""
    stub = service.stub
    create_agent(stub, "coder")
    create_agent(stub, "router", peers=["coder"], settings=pb.AgentSettings(redact_pii=True))
    routing = resolve(stub, "router", **web()).session.session_id
    forwarded = pb.Message(role=pb.ROLE_USER, content="fix it", sender="u-42", message_ref="tg:9:7")
    target = pb.Source(transport="peer", conversation_id="router:chat")
    request = pb.SendToPeerRequest(
        agent="router", session_id=routing, to_agent="coder", source=target, message=forwarded
    )
    sends = [stub.SendToPeer(request) for _ in range(2)]
    assert [send.duplicate for send in sends] == [False, True]
    assert sends[0].event.inbox_posted.message.message_ref.startswith("ref_")
    assert _inbox(stub, sends[0].event.session_id, "coder") == ["fix it"]

    task = pb.Message(role=pb.ROLE_USER, content="parse", sender="u-42", message_ref="ticket-7")
    delegate = pb.DelegateRequest(
        agent="router", session_id=routing, to_agent="coder", task=task, context="t7"
    )
    delegations = [stub.Delegate(delegate) for _ in range(2)]
    assert [d.duplicate for d in delegations] == [False, True]
    assert _inbox(stub, delegations[0].session.session_id, "coder") == ["parse"]


BAD_REFS = {
    "too long": "m" * 257,
    "a NUL": "m\x00",
    "a newline": "m-1\n",
    "a line separator": "m\u20281",
    "a no-break space": "m\u00a01",
    "a private-use character": "m\ue000",
    "a zero-width joiner": "m\u200d1",
}


@pytest.mark.parametrize("ref", list(BAD_REFS.values()), ids=list(BAD_REFS))
def test_an_over_long_or_unprintable_message_ref_is_refused_naming_the_field(
    team: InProcessSession, ref: str
) -> None:
    stub = team.stub
    routing = resolve(stub, "router", **web()).session.session_id
    before = _log(stub)
    message = pb.Message(role=pb.ROLE_USER, content="hi", message_ref=ref)
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("message.message_ref", lambda: _post(stub, routing, ref, agent="router")),
        (
            "message.message_ref",
            lambda: stub.SendToPeer(
                pb.SendToPeerRequest(
                    agent="router",
                    session_id=routing,
                    to_agent="coder",
                    to_session_id=routing,
                    message=message,
                )
            ),
        ),
        (
            "task.message_ref",
            lambda: stub.Delegate(
                pb.DelegateRequest(
                    agent="router", session_id=routing, to_agent="coder", task=message
                )
            ),
        ),
    ]
    for field, call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_details(refused.value)[1] == [field]
        assert field in (refused.value.details() or "")
    assert _log(stub) == before, "nothing written"
    longest = _post(stub, routing, "m" * 256, agent="router")
    assert not longest.duplicate, "256 printable characters are a message_ref"
