"""Routing keys are injective (issue 21 items 1 and 13): distinct sources never share a
key, so never a session; and a peer thread is bound to the agent that really sends.

The property tests draw sources from ids full of ':', '%', '=' and non-ASCII letters;
the named pairs are the ones that shared a session before, through real ResolveSession,
Delegate and SendToPeer calls on both backends."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from session_service import legacy_keys, routing
from session_service.pii import Redactor
from session_service.records import ChatType, RoutingPolicy, Source
from switchboard.auth import parse_tokens
from switchboard.errors import InvalidArgument
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message
from tests.status import error_reason

# -- the property: distinct conversations, distinct keys -----------------------------------

#: Few letters, many separators, escapes and markers: ids that split and join in many ways.
PIECES = ["a", "b", ":", "%", "=", "3A", "c=", "t=", "u=", "s=", "id=", "ë", "日"]
IDS = st.lists(st.sampled_from(PIECES), max_size=4).map("".join)
CHAT_TRANSPORTS = ["telegram", "matrix", "slack"]
NON_CHAT = ["web", "cron", "repl", "peer"]
POLICIES = st.builds(RoutingPolicy, shared_group_sessions=st.booleans(),
                     per_user_thread_sessions=st.booleans())  # fmt: skip


@st.composite
def sources(draw: st.DrawFn, ids: st.SearchStrategy[str] = IDS) -> Source:
    transport = draw(st.sampled_from(CHAT_TRANSPORTS + NON_CHAT))
    if transport in NON_CHAT:
        sender = draw(st.sampled_from(["planner", "mallory"])) if transport == "peer" else ""
        return Source(transport=transport, conversation_id=draw(ids), from_agent=sender)
    return Source(
        transport=transport,
        chat_type=draw(st.sampled_from([ChatType.DM, ChatType.GROUP, ChatType.CHANNEL])),
        scope_id=draw(ids),
        chat_id=draw(ids),
        thread_id=draw(ids),
        user_id=draw(ids),
    )


@st.composite
def neighbours(draw: st.DrawFn) -> list[Source]:
    """Sources made of the same few ids, a few of them joined with ':': the same id as
    a user here and a thread there, "a:b" beside "a" and "b" (how keys collided)."""
    pool = draw(st.lists(IDS, min_size=1, max_size=3))
    pool += [f"{a}:{b}" for a in pool[:2] for b in pool[:2]] + [""]
    return draw(st.lists(sources(st.sampled_from(pool)), min_size=2, max_size=12))


def conversation(agent: str, source: Source, policy: RoutingPolicy) -> tuple[Any, ...]:
    """What a source names under a policy, written from the rules (not from the code):
    what the policy ignores is left out, and every id keeps its role."""
    if source.transport == "peer":
        return (agent, "peer", source.from_agent, source.conversation_id)
    if source.transport in NON_CHAT:
        return (agent, source.transport, source.conversation_id)
    if source.chat_type == ChatType.DM:
        owner = ("chat", source.chat_id) if source.chat_id else ("user", source.user_id)
        return (agent, source.transport, "dm", source.scope_id, owner, source.thread_id)
    per_user = not policy.shared_group_sessions and (
        not source.thread_id or policy.per_user_thread_sessions
    )
    member = source.user_id if per_user else ""
    return (agent, source.transport, source.chat_type, source.scope_id, source.chat_id,
            source.thread_id, member)  # fmt: skip


_CHAT_TYPES = {ChatType.DM: "dm", ChatType.GROUP: "group", ChatType.CHANNEL: "channel"}
_UNESCAPED = {"25": "%", "3A": ":"}


def read_back(key: str) -> tuple[Any, ...]:
    """A key cut at ':' into its components, each id unescaped: the conversation it
    names, read as the encoding says (so a key that reads back right is no other's)."""
    _, agent, transport, *rest = key.split(":")
    chat_type = rest.pop(0) if transport not in NON_CHAT else None
    ids: dict[str, str] = {}
    for component in rest:
        marker, _, value = component.partition("=")
        assert marker not in ids, f"{key!r}: {marker}= twice"
        ids[marker] = re.sub(r"%(25|3A)", lambda found: _UNESCAPED[found.group(1)], value)
    return agent, transport, chat_type, ids


def named_ids(agent: str, source: Source, policy: RoutingPolicy) -> tuple[Any, ...]:
    """`conversation` in the shape `read_back` gives."""
    named = conversation(agent, source, policy)
    if source.transport == "peer":
        ids = {"from": named[2], "id": named[3]}
        return agent, "peer", None, {m: v for m, v in ids.items() if v}
    if source.transport in NON_CHAT:
        return agent, source.transport, None, {"id": named[2]} if named[2] else {}
    if source.chat_type == ChatType.DM:
        (role, owner), thread = named[4], named[5]
        ids = {"s": named[3], "c" if role == "chat" else "u": owner, "t": thread}
    else:
        ids = {"s": named[3], "c": named[4], "t": named[5], "u": named[6]}
    return (
        agent,
        source.transport,
        _CHAT_TYPES[source.chat_type],
        {m: v for m, v in ids.items() if v},
    )


@settings(max_examples=500, deadline=None)
@given(source=sources(), policy=POLICIES, agent=st.sampled_from(["main", "a-b", "x_1"]))
def test_a_key_reads_back_as_the_conversation_it_names(
    source: Source, policy: RoutingPolicy, agent: str
) -> None:
    key = routing.unbounded_key(agent, source, policy)
    assert read_back(key) == named_ids(agent, source, policy)


def _assert_injective(agent: str, many: list[Source], policy: RoutingPolicy) -> None:
    keys: dict[str, tuple[Any, ...]] = {}
    for source in many:
        key = routing.unbounded_key(agent, source, policy)
        named = conversation(agent, source, policy)
        assert keys.setdefault(key, named) == named, f"{key!r} names two conversations"
    assert len(set(keys.values())) == len(keys), "one conversation got two keys"


@settings(max_examples=400, deadline=None)
@given(many=neighbours(), policy=POLICIES, agent=st.sampled_from(["main", "a-b", "x_1"]))
def test_distinct_sources_give_distinct_keys(
    many: list[Source], policy: RoutingPolicy, agent: str
) -> None:
    _assert_injective(agent, many, policy)


@settings(max_examples=300, deadline=None)
@given(many=neighbours(), policy=POLICIES, keyed=st.booleans())
def test_distinct_sources_give_distinct_keys_with_redaction(
    many: list[Source], policy: RoutingPolicy, keyed: bool
) -> None:
    """With redaction the key is built from the stored (hashed) source: distinct stored
    sources never share a key. (Two raw ids share a stored one only by a 48-bit digest
    collision, or when an id is already in redacted shape, which is kept.)"""
    redactor = Redactor(b"k" * 16 if keyed else None)
    _assert_injective("main", [routing.stored_source(s, redactor) for s in many], policy)


@settings(max_examples=300, deadline=None)
@given(source=sources(), policy=POLICIES)
def test_an_old_key_upgrades_to_the_key_its_source_gets_now(
    source: Source, policy: RoutingPolicy
) -> None:
    if source.transport == "peer":
        # Old releases named the sender only in the id: "<agent>:<context>".
        source = replace(source, conversation_id=f"{source.from_agent}:{source.conversation_id}")
    old = legacy_keys.legacy_key("main", source, policy)
    stored = replace(source, from_agent="")  # the old release stored no sender
    assert legacy_keys.upgraded_key("main", old, stored) == routing.unbounded_key(
        "main", source, policy
    )


def test_a_too_long_key_is_refused_clearly() -> None:
    source = Source(transport="slack", chat_type=ChatType.CHANNEL, scope_id="T" * 200,
                    chat_id=":" * 100, user_id="U")  # fmt: skip
    with pytest.raises(InvalidArgument, match=r"routing key of \d+ characters; the limit is 512"):
        routing.routing_key("main", source, None)


# -- the pairs that shared a session, through real calls -----------------------------------

DM, GROUP = pb.CHAT_TYPE_DM, pb.CHAT_TYPE_GROUP
PAIRS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "telegram dm chat 'a:b' / chat 'a' in thread 'b'": (
        {"transport": "telegram", "chat_type": DM, "chat_id": "a:b", "user_id": "u1"},
        {"transport": "telegram", "chat_type": DM, "chat_id": "a", "thread_id": "b",
         "user_id": "u2"},
    ),
    "telegram group member 4242 / forum topic 4242": (
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100123", "user_id": "4242"},
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100123", "thread_id": "4242",
         "user_id": "31337"},
    ),
    "telegram forum topic 77 / group member 77": (
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100999", "thread_id": "77",
         "user_id": "1"},
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100999", "user_id": "77"},
    ),
    "matrix room member / room thread": (
        {"transport": "matrix", "chat_type": GROUP, "chat_id": "!room:example.org",
         "user_id": "@alice:example.org"},
        {"transport": "matrix", "chat_type": GROUP, "chat_id": "!room",
         "thread_id": "example.org:@alice:example.org", "user_id": "@bob:example.org"},
    ),
    "matrix dm room / dm room thread": (
        {"transport": "matrix", "chat_type": DM, "chat_id": "!dm:example.org",
         "user_id": "@carol:example.org"},
        {"transport": "matrix", "chat_type": DM, "chat_id": "!dm", "thread_id": "example.org",
         "user_id": "@dave:example.org"},
    ),
    "slack dm in workspace T1 / dm chat 'T1' thread 'D1'": (
        {"transport": "slack", "chat_type": DM, "scope_id": "T1", "chat_id": "D1",
         "user_id": "U1"},
        {"transport": "slack", "chat_type": DM, "chat_id": "T1", "thread_id": "D1",
         "user_id": "U2"},
    ),
    "discord group 'g' member 'u' / group chat 'g:u'": (
        {"transport": "discord", "chat_type": GROUP, "chat_id": "g", "user_id": "u"},
        {"transport": "discord", "chat_type": GROUP, "chat_id": "g:u", "user_id": ""},
    ),
}  # fmt: skip
#: Shared a key only when redacted: the thread id (not hashed) equals the member's digest.
REDACTED_PAIR = (
    {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100777", "user_id": "888"},
    {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100777",
     "thread_id": f"user_{Redactor().digest('888')}", "user_id": "999"},
)  # fmt: skip


def _history(service: InProcessSession, session_id: str) -> list[str]:
    answer = service.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id, limit=100)
    )
    return [item.message.content for item in answer.messages]


def _two_conversations_two_sessions(
    service: InProcessSession, first: dict[str, Any], second: dict[str, Any]
) -> None:
    opened = resolve(service.stub, **first).session
    append(service.stub, opened.session_id, user_message("the first person's secret"))
    other = resolve(service.stub, **second)
    assert other.created, "the second conversation reached the first's session"
    assert other.session.session_id != opened.session_id
    assert other.session.routing_key != opened.routing_key
    append(service.stub, other.session.session_id, user_message("the second person's words"))
    assert _history(service, opened.session_id) == ["the first person's secret"]
    assert _history(service, other.session.session_id) == ["the second person's words"]
    again = resolve(service.stub, **first)
    assert (again.created, again.session.session_id) == (False, opened.session_id)


@pytest.mark.parametrize("redact", [False, True], ids=["plain", "redacting"])
@pytest.mark.parametrize("pair", list(PAIRS), ids=list(PAIRS))
def test_a_pair_that_shared_a_session_gets_two(
    start_session: StartSession, pair: str, redact: bool
) -> None:
    service = start_session()
    create_agent(service.stub, settings=pb.AgentSettings(redact_pii=redact))
    _two_conversations_two_sessions(service, *PAIRS[pair])


def test_the_redacted_pair_gets_two_sessions(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub, settings=pb.AgentSettings(redact_pii=True))
    _two_conversations_two_sessions(service, *REDACTED_PAIR)


# -- peer threads are bound to the real sender ---------------------------------------------

GRANTS = parse_tokens("tok-ab=agents:a,b;tok-cb=agents:c,b;tok-root=admin")


def _as(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def peers(database_url: str, loop_thread: EventLoopThread) -> Any:
    """Agents a and c may talk to b; c has a delegation thread in b ("c:ctx"). The
    caller holds a token for agents a and b, as in the issue."""
    with session_server(loop_thread, database_url, auth=GRANTS) as service:
        stub = service.stub
        for name in ("b", "a", "c"):
            peers = ["b"] if name != "b" else []
            stub.CreateAgent(
                pb.CreateAgentRequest(agent=pb.Agent(name=name, peers=peers)),
                metadata=_as("tok-root"),
            )
        web = pb.Source(transport="web", conversation_id="desk")
        own = {
            name: stub.ResolveSession(
                pb.ResolveSessionRequest(agent=name, source=web), metadata=_as(token)
            ).session.session_id
            for name, token in (("a", "tok-ab"), ("c", "tok-cb"))
        }
        task = pb.Message(role=pb.ROLE_USER, content="c's confidential task")
        delegated = stub.Delegate(
            pb.DelegateRequest(agent="c", session_id=own["c"], to_agent="b", task=task,
                               context="ctx"),
            metadata=_as("tok-cb"),
        ).session  # fmt: skip
        yield service, own, delegated


def _inbox(service: InProcessSession, session_id: str) -> list[tuple[str, str]]:
    state = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="b", session_id=session_id), metadata=_as("tok-root")
    ).state
    return [(q.message.sender, q.message.content) for q in state.inbox]


def _send(service: InProcessSession, own: dict[str, str], **fields: Any) -> Any:
    message = pb.Message(role=pb.ROLE_USER, content="forged", sender=fields.pop("sender", ""))
    request = pb.SendToPeerRequest(
        agent="a", session_id=own["a"], to_agent="b", message=message, **fields
    )
    return service.stub.SendToPeer(request, metadata=_as("tok-ab"))


def test_a_forged_peer_conversation_id_never_reaches_another_agents_thread(peers: Any) -> None:
    service, own, delegated = peers
    assert delegated.source.from_agent == "c"
    assert delegated.routing_key == "agent:b:peer:from=c:id=c%3Actx"
    sent = _send(service, own, source=pb.Source(transport="peer", conversation_id="c:ctx"))
    assert sent.event.session_id != delegated.session_id
    landed = service.stub.GetSession(
        pb.GetSessionRequest(agent="b", session_id=sent.event.session_id), metadata=_as("tok-ab")
    ).session
    assert landed.source.from_agent == "a"
    assert landed.routing_key == "agent:b:peer:from=a:id=c%3Actx"
    assert _inbox(service, delegated.session_id) == [("agent:c", "c's confidential task")]
    assert _inbox(service, landed.session_id) == [("agent:a", "forged")]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"sender": "agent:c"}, "message.sender"),
        ({"source": pb.Source(transport="peer", conversation_id="ctx", from_agent="c")},
         "source.from_agent"),
    ],
    ids=["sender naming another agent", "source naming another sender"],
)  # fmt: skip
def test_naming_another_agent_as_the_sender_is_refused_and_writes_nothing(
    peers: Any, fields: dict[str, Any], field: str
) -> None:
    service, own, delegated = peers
    store = service.unit.store
    with store.database.connection_context():
        head = store.log.head()
    fields.setdefault("source", pb.Source(transport="peer", conversation_id="c:ctx"))
    with pytest.raises(grpc.RpcError) as refused:
        _send(service, own, **fields)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == "PEER_SENDER_MISMATCH"
    assert field in (refused.value.details() or "")
    with store.database.connection_context():
        assert store.log.head() == head
    assert _inbox(service, delegated.session_id) == [("agent:c", "c's confidential task")]


def test_delegate_refuses_a_task_sent_as_another_agent(peers: Any) -> None:
    service, own, _ = peers
    task = pb.Message(role=pb.ROLE_USER, content="x", sender="agent:c")
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.Delegate(
            pb.DelegateRequest(agent="a", session_id=own["a"], to_agent="b", task=task,
                               context="ctx"),
            metadata=_as("tok-ab"),
        )  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "task.sender" in (refused.value.details() or "")


def test_delegate_and_send_to_peer_meet_in_one_thread_of_their_sender(peers: Any) -> None:
    service, own, _ = peers
    task = pb.Message(role=pb.ROLE_USER, content="a's task", sender="agent:a")
    delegated = service.stub.Delegate(
        pb.DelegateRequest(agent="a", session_id=own["a"], to_agent="b", task=task,
                           context="ctx"),
        metadata=_as("tok-ab"),
    ).session  # fmt: skip
    relayed = "u-42"  # a person's id the agent relays: kept
    sent = _send(
        service, own, source=pb.Source(transport="peer", conversation_id="a:ctx"), sender=relayed
    )
    assert sent.event.session_id == delegated.session_id
    assert _inbox(service, delegated.session_id) == [("agent:a", "a's task"), (relayed, "forged")]


def test_a_peer_source_routed_by_the_agent_itself_is_its_own(peers: Any) -> None:
    service, _, delegated = peers
    source = pb.Source(transport="peer", conversation_id="c:ctx")
    own = service.stub.ResolveSession(
        pb.ResolveSessionRequest(agent="b", source=source), metadata=_as("tok-ab")
    ).session
    assert own.session_id != delegated.session_id
    assert own.routing_key == "agent:b:peer:from=b:id=c%3Actx"
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ResolveSession(
            pb.ResolveSessionRequest(agent="b", source=pb.Source(
                transport="peer", conversation_id="ctx", from_agent="c")),
            metadata=_as("tok-ab"),
        )  # fmt: skip
    assert error_reason(refused.value) == "PEER_SENDER_MISMATCH"
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ResolveSession(
            pb.ResolveSessionRequest(agent="b", source=pb.Source(
                transport="web", conversation_id="x", from_agent="b")),
            metadata=_as("tok-ab"),
        )  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "source.from_agent" in (refused.value.details() or "")
