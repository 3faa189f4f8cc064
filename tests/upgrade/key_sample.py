"""Conversations whose routing keys collided before the injective encoding, written
through the real SessionService's gRPC API by the release that had the collisions.

`tests/upgrade/make_key_fixture.py` runs `write` with that release's code (commit
89c0bf6) and stores the database and what `write` returns; the key-migration tests
(tests/session/test_key_migration.py) upgrade a copy with the new code and check
that every conversation still resolves to its session, and that the sessions two
conversations shared are reported. Keep this module runnable by that old code:
only the generated stubs, no session_service imports.
"""

from __future__ import annotations

import hashlib
from typing import Any

from google.protobuf.json_format import MessageToDict

from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc

DM, GROUP = spb.CHAT_TYPE_DM, spb.CHAT_TYPE_GROUP


def _sha12(value: str) -> str:
    """The unkeyed digest a redacting agent stores (the fixture's server has no PII key)."""
    return hashlib.sha256(value.encode()).hexdigest()[:12]


#: (name, agent, source fields, sender). A name ending in "/second" is the second
#: conversation of a pair: it reached the session of the pair's "/first".
CONVERSATIONS: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "dm-colon/first",
        "plain",
        {"transport": "telegram", "chat_type": DM, "chat_id": "a:b", "user_id": "u-ab"},
        "u-ab",
    ),
    (
        "dm-colon/second",
        "plain",
        {
            "transport": "telegram",
            "chat_type": DM,
            "chat_id": "a",
            "thread_id": "b",
            "user_id": "u-a",
        },
        "u-a",
    ),
    (
        "member-vs-topic/first",
        "plain",
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100123", "user_id": "4242"},
        "4242",
    ),
    (
        "member-vs-topic/second",
        "plain",
        {
            "transport": "telegram",
            "chat_type": GROUP,
            "chat_id": "-100123",
            "thread_id": "4242",
            "user_id": "31337",
        },
        "31337",
    ),
    (
        "topic-vs-member/first",
        "plain",
        {
            "transport": "telegram",
            "chat_type": GROUP,
            "chat_id": "-100999",
            "thread_id": "77",
            "user_id": "1",
        },
        "1",
    ),
    (
        "topic-vs-member/second",
        "plain",
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100999", "user_id": "77"},
        "77",
    ),
    (
        "matrix-room/first",
        "plain",
        {
            "transport": "matrix",
            "chat_type": GROUP,
            "chat_id": "!room:example.org",
            "user_id": "@alice:example.org",
        },
        "@alice:example.org",
    ),
    (
        "matrix-room/second",
        "plain",
        {
            "transport": "matrix",
            "chat_type": GROUP,
            "chat_id": "!room",
            "thread_id": "example.org:@alice:example.org",
            "user_id": "@bob:example.org",
        },
        "@bob:example.org",
    ),
    (
        "matrix-dm/first",
        "plain",
        {
            "transport": "matrix",
            "chat_type": DM,
            "chat_id": "!dm:example.org",
            "user_id": "@carol:example.org",
        },
        "@carol:example.org",
    ),
    (
        "matrix-dm/second",
        "plain",
        {
            "transport": "matrix",
            "chat_type": DM,
            "chat_id": "!dm",
            "thread_id": "example.org",
            "user_id": "@dave:example.org",
        },
        "@dave:example.org",
    ),
    (
        "slack-scope/first",
        "plain",
        {"transport": "slack", "chat_type": DM, "scope_id": "T1", "chat_id": "D1", "user_id": "U1"},
        "U1",
    ),
    (
        "slack-scope/second",
        "plain",
        {
            "transport": "slack",
            "chat_type": DM,
            "chat_id": "T1",
            "thread_id": "D1",
            "user_id": "U2",
        },
        "U2",
    ),
    (
        "member-vs-colon-chat/first",
        "plain",
        {"transport": "discord", "chat_type": GROUP, "chat_id": "g", "user_id": "u"},
        "u",
    ),
    (
        "member-vs-colon-chat/second",
        "plain",
        {"transport": "discord", "chat_type": GROUP, "chat_id": "g:u"},
        "v",
    ),
    ("web", "plain", {"transport": "web", "conversation_id": "tab-1"}, "visitor"),
    (
        "telegram-dm",
        "plain",
        {"transport": "telegram", "chat_type": DM, "chat_id": "12345", "user_id": "12345"},
        "12345",
    ),
    (
        "slack-thread",
        "plain",
        {
            "transport": "slack",
            "chat_type": spb.CHAT_TYPE_CHANNEL,
            "scope_id": "T9",
            "chat_id": "C9",
            "thread_id": "171.001",
            "user_id": "U9",
        },
        "U9",
    ),
    ("cron", "plain", {"transport": "cron", "conversation_id": "job:nightly"}, ""),
    (
        "private-dm",
        "private",
        {"transport": "telegram", "chat_type": DM, "chat_id": "555", "user_id": "555"},
        "555",
    ),
    (
        "private-member/first",
        "private",
        {"transport": "telegram", "chat_type": GROUP, "chat_id": "-100777", "user_id": "888"},
        "888",
    ),
    # The thread id is not hashed: one equal to the member's digest shares the key.
    (
        "private-member/second",
        "private",
        {
            "transport": "telegram",
            "chat_type": GROUP,
            "chat_id": "-100777",
            "thread_id": f"user_{_sha12('888')}",
            "user_id": "999",
        },
        "999",
    ),
    # A redacting agent's own threads: that release stored their thread ids raw (the
    # release after it hashes them), each conversation in a session of its own.
    (
        "private-topic",
        "private",
        {
            "transport": "telegram",
            "chat_type": GROUP,
            "chat_id": "-100555",
            "thread_id": "17585",
            "user_id": "321",
        },
        "321",
    ),
    (
        "private-slack-dm-thread",
        "private",
        {
            "transport": "slack",
            "chat_type": DM,
            "scope_id": "T1",
            "chat_id": "D55",
            "thread_id": "171.002",
            "user_id": "U55",
        },
        "U55",
    ),
]


def _say(stub: spb_grpc.SessionServiceStub, agent: str, sid: str, text: str, sender: str) -> None:
    message = spb.Message(role=spb.ROLE_USER, content=text, sender=sender)
    stub.AppendEvents(
        spb.AppendEventsRequest(
            agent=agent,
            session_id=sid,
            events=[spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))],
        )
    )


def _resolve(stub: spb_grpc.SessionServiceStub, agent: str, source: dict[str, Any]) -> Any:
    return stub.ResolveSession(spb.ResolveSessionRequest(agent=agent, source=spb.Source(**source)))


def _peer(
    stub: spb_grpc.SessionServiceStub, sender: str, session_id: str, conversation: str, text: str
) -> str:
    """SendToPeer into coder's session for a peer source; the receiving session's id."""
    answer = stub.SendToPeer(
        spb.SendToPeerRequest(
            agent=sender, session_id=session_id, to_agent="coder",
            source=spb.Source(transport="peer", conversation_id=conversation),
            message=spb.Message(role=spb.ROLE_USER, content=text, sender="agent:planner"),
        )
    )  # fmt: skip
    return str(answer.event.session_id)


def write(stub: spb_grpc.SessionServiceStub) -> dict[str, Any]:
    """Writes the data set; returns the conversations (name -> agent, source, the session
    it resolved to, whether that call created it) and the named sessions' ids."""
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="plain")))
    stub.CreateAgent(
        spb.CreateAgentRequest(
            agent=spb.Agent(name="private", settings=spb.AgentSettings(redact_pii=True))
        )
    )
    for name in ("planner", "mallory"):
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name=name, peers=["coder"])))
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="coder")))

    conversations: dict[str, Any] = {}
    for name, agent, source, sender in CONVERSATIONS:
        resolved = _resolve(stub, agent, source)
        sid = resolved.session.session_id
        if name.endswith("/second"):
            first = conversations[name.replace("/second", "/first")]["session_id"]
            assert (sid, resolved.created) == (first, False), f"{name} did not collide"
        _say(stub, agent, sid, f"{name}: a message", sender)
        conversations[name] = {
            "agent": agent,
            "source": MessageToDict(spb.Source(**source), preserving_proto_field_name=True),
            "session_id": sid,
            "created": resolved.created,
        }

    named: dict[str, str] = {}
    # Two sources on one key over time: the first session ended, the second opened one.
    ended_source: dict[str, Any] = {
        "transport": "telegram",
        "chat_type": DM,
        "chat_id": "x:y",
        "user_id": "x",
    }
    ended = _resolve(stub, "plain", ended_source).session.session_id
    _say(stub, "plain", ended, "x:y before it ended", "x")
    stub.EndSession(spb.EndSessionRequest(agent="plain", session_id=ended, reason="done"))
    again_source: dict[str, Any] = {
        "transport": "telegram",
        "chat_type": DM,
        "chat_id": "x",
        "thread_id": "y",
    }
    again = _resolve(stub, "plain", again_source).session.session_id
    _say(stub, "plain", again, "x + thread y", "y-user")
    named.update(ended_xy=ended, reopened_x_thread_y=again)
    conversations["reopened-x-thread-y"] = {
        "agent": "plain",
        "source": MessageToDict(spb.Source(**again_source), preserving_proto_field_name=True),
        "session_id": again,
        "created": True,
    }

    # Peer threads: a delegation, a send by source, and sends that named another agent.
    planning = _resolve(stub, "planner", {"transport": "web", "conversation_id": "plan"})
    planning_id = planning.session.session_id
    task = spb.Message(role=spb.ROLE_USER, content="write the parser", sender="agent:planner")
    delegated = stub.Delegate(
        spb.DelegateRequest(
            agent="planner", session_id=planning_id, to_agent="coder", context="ticket-7", task=task
        )
    ).session.session_id
    chat = _peer(stub, "planner", planning_id, "planner:chat", "hello coder")
    no_prefix = _peer(stub, "planner", planning_id, "ticket-42", "no agent named")
    plotting = _resolve(stub, "mallory", {"transport": "web", "conversation_id": "plot"})
    plotting_id = plotting.session.session_id
    into_delegated = _peer(stub, "mallory", plotting_id, "planner:ticket-7", "forged into it")
    assert into_delegated == delegated, "the old rule lets the forged send in"
    forged = _peer(stub, "mallory", plotting_id, "planner:secret", "forged thread")
    named.update(
        delegated=delegated, peer_chat=chat, peer_no_prefix=no_prefix, peer_forged=forged,
        planning=planning_id, plotting=plotting_id,
    )  # fmt: skip

    # Forks (no key of their own), a reset (a new session on the same key), snapshots.
    merged = conversations["dm-colon/first"]["session_id"]
    named["fork_of_merged"] = stub.ForkSession(
        spb.ForkSessionRequest(agent="plain", session_id=merged)
    ).session.session_id
    telegram_dm = conversations["telegram-dm"]["session_id"]
    reset = stub.ResetSession(
        spb.ResetSessionRequest(agent="plain", session_id=telegram_dm, reason="/new")
    )
    named["reset_of_telegram_dm"] = reset.session.session_id
    conversations["telegram-dm"]["session_id"] = reset.session.session_id
    _say(stub, "plain", reset.session.session_id, "after the reset", "12345")
    for agent, sid in (
        ("plain", conversations["member-vs-topic/first"]["session_id"]),
        ("coder", delegated),
        ("private", conversations["private-dm"]["session_id"]),
    ):
        stub.SnapshotSession(spb.SnapshotSessionRequest(agent=agent, session_id=sid))

    # A rewind across part of it, and a branch after it.
    stub.CreateCheckpoint(spb.CreateCheckpointRequest(label="before-branch"))
    web = conversations["web"]["session_id"]
    _say(stub, "plain", web, "abandoned by the rewind", "visitor")
    stub.Rewind(spb.RewindRequest(checkpoint="before-branch"))
    _say(stub, "plain", web, "after the rewind", "visitor")
    cron = conversations["cron"]["session_id"]
    stub.EndSession(spb.EndSessionRequest(agent="plain", session_id=cron, reason="retired"))
    return {"conversations": conversations, "sessions": named}


def read_all(stub: spb_grpc.SessionServiceStub) -> dict[str, Any]:
    """Every session of every agent: its summary and its history, as JSON-able data."""
    sessions: dict[str, Any] = {}
    for agent in ("plain", "private", "planner", "mallory", "coder"):
        listed = stub.ListSessions(spb.ListSessionsRequest(agent=agent, page_size=1000))
        for session in listed.sessions:
            history = stub.GetHistory(
                spb.GetHistoryRequest(agent=agent, session_id=session.session_id, limit=1000)
            )
            state = stub.GetSessionState(
                spb.GetSessionStateRequest(agent=agent, session_id=session.session_id)
            )
            sessions[session.session_id] = {
                "session": MessageToDict(session, preserving_proto_field_name=True),
                "history": [
                    MessageToDict(m.message, preserving_proto_field_name=True)
                    for m in history.messages
                ],
                "inbox": [
                    MessageToDict(q.message, preserving_proto_field_name=True)
                    for q in state.state.inbox
                ],
            }
    return sessions
