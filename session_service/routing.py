"""Routing keys: the deterministic, transport-namespaced name of a conversation, in an
encoding where two distinct sources never share a key.

    agent:<agent>:<transport>:<chat type>[:s=<scope>][:c=<chat>][:t=<thread>][:u=<user>]
    agent:<agent>:<transport>[:u=<user>]:id=<conversation id>       web, cron, repl, frameworks
    agent:<agent>:peer:from=<sending agent>:id=<conversation id>      peer

Why no two sources share a key: agent names, transports and chat type names hold
no ':', and no id does once '%' and ':' are written `%25` and `%3A`; so cutting a
key at ':' gives back its components, each named by its marker, in a fixed order.
A thread and a user never stand in the same place. (Keys of releases before this
encoding joined the bare ids with ':', so "a:b" and "a" + thread "b" were one key;
`session_service.legacy_keys` reads those.)

Which ids a chat key holds is Hermes' policy, unchanged:
  - DMs are keyed by the chat id, falling back to the user; with the thread, if any.
    The user never appears beside a chat id.
  - Groups and channels get one session per member unless the agent shares them;
    threads are shared unless the agent isolates them per member.
With PII redaction on, chat ids become `<platform>:<12 hex>`, thread ids
`thread_<12 hex>` and user ids `user_<12 hex>` (`session_service.pii`) before the
key is built, and are encoded like any id, so raw ids never reach the database.

Non-chat transports name the conversation's user when the source has one, so that
an agent framework's (user, conversation id) pairs (Google ADK's sessions) never
meet across users. Keys of conversations opened with a user before that hold no
`u=` (`key_without_user` finds them).

A peer thread's `from=` is the agent that sends into it, bound by the server to
the calling agent (`checked_source`), never taken from the caller's conversation
id: one agent cannot reach the thread another agent's messages arrive in.
"""

from __future__ import annotations

from dataclasses import replace

from session_service import pii
from session_service.pii import Redactor
from session_service.records import ChatType, RoutingPolicy, Source
from switchboard import validation
from switchboard.errors import InvalidArgument

PEER = "peer"
#: Non-chat transports whose keys held no user before users were key components.
KEYED_WITHOUT_USER = frozenset({"web", "cron", "repl"})
#: The transports of the agent frameworks' session stores (issue 23).
FRAMEWORK_TRANSPORTS = frozenset({"adk", "openai_agents", "langgraph"})
NON_CHAT_TRANSPORTS = KEYED_WITHOUT_USER | FRAMEWORK_TRANSPORTS | {PEER}
#: The routing key column's width (and the ledger's session_key limit).
MAX_ROUTING_KEY_LEN = 512

CHAT_TYPE_NAMES = {
    ChatType.DM: "dm",
    ChatType.GROUP: "group",
    ChatType.CHANNEL: "channel",
    ChatType.THREAD: "thread",
}


def checked_source(source: Source, calling_agent: str) -> Source:
    """Validates a source; returns it as the server routes it: a peer source bound
    to `calling_agent` (the request's `agent`, already checked), which sends."""
    validation.platform("source.transport", source.transport)
    if source.transport in NON_CHAT_TRANSPORTS:
        validation.routing_key("source.conversation_id", source.conversation_id, max_len=256)
        if source.user_id and source.transport != PEER:
            validation.routing_key("source.user_id", source.user_id, max_len=256)
    else:
        if source.chat_type not in CHAT_TYPE_NAMES:
            raise InvalidArgument(
                "source.chat_type", "is required for a chat platform: DM, GROUP, CHANNEL or THREAD"
            )
        for field in ("chat_id", "thread_id", "user_id", "scope_id"):
            value = getattr(source, field)
            if value:
                validation.routing_key(f"source.{field}", value, max_len=256)
    return _bound_to_sender(source, calling_agent)


def _bound_to_sender(source: Source, calling_agent: str) -> Source:
    if source.transport != PEER:
        if source.from_agent:
            raise InvalidArgument(
                "source.from_agent",
                f"is for transport 'peer' only; leave it empty for {source.transport!r}",
            )
        return source
    if source.from_agent and source.from_agent != calling_agent:
        raise InvalidArgument(
            "source.from_agent",
            f"names agent {source.from_agent[:64]!r}, but this call is agent "
            f"{calling_agent!r}'s: a peer thread is always the sending agent's own; leave "
            "from_agent empty (the server sets it)",
            reason="PEER_SENDER_MISMATCH",
        )
    return replace(source, from_agent=calling_agent)


def stored_source(source: Source, redactor: Redactor | None) -> Source:
    """The source as it may be stored: its chat, thread and user ids hashed by
    `redactor` (given when the agent redacts PII). Scope and conversation ids name
    places, not people, and stay as they are."""
    stored = replace(source)
    if redactor is not None and source.transport not in NON_CHAT_TRANSPORTS:
        stored.chat_id = redactor.chat(source.transport, source.chat_id)
        stored.user_id = redactor.user(source.user_id)
        stored.thread_id = redactor.thread(source.thread_id)
    elif redactor is not None and source.transport != PEER:
        stored.user_id = redactor.user(source.user_id)  # a person, on any transport
    return stored


def key_without_user(agent: str, source: Source, policy: RoutingPolicy | None) -> str | None:
    """The key a conversation with a user on web, cron or repl got before users were
    key components (None when its key never differed)."""
    if source.transport not in KEYED_WITHOUT_USER or not source.user_id:
        return None
    return unbounded_key(agent, replace(source, user_id=""), policy)


def key_with_raw_thread(
    agent: str, source: Source, stored: Source, policy: RoutingPolicy | None
) -> str | None:
    """The key a redacting agent's conversation in a thread got before thread ids were
    hashed (releases before this one hashed only chat and user ids; the key migration
    rebuilt such keys from the stored sources, raw threads and all): `stored` with the
    raw thread of `source`. None when `stored` holds the thread as given."""
    if stored.thread_id == source.thread_id:
        return None
    return unbounded_key(agent, replace(stored, thread_id=source.thread_id), policy)


def holds_raw_thread(source: Source) -> bool:
    """Whether a stored chat source keeps its thread id unhashed (a redacting agent's
    session from before thread ids were hashed, or any non-redacting agent's)."""
    return (
        source.transport not in NON_CHAT_TRANSPORTS
        and bool(source.thread_id)
        and not pii.is_redacted_thread(source.thread_id)
    )


def routing_key(agent: str, source: Source, policy: RoutingPolicy | None) -> str:
    """The key of a (checked, already redacted if need be) source; INVALID_ARGUMENT
    (ROUTING_KEY_TOO_LONG) past `MAX_ROUTING_KEY_LEN` characters."""
    key = unbounded_key(agent, source, policy)
    if len(key) > MAX_ROUTING_KEY_LEN:
        # Each id is bounded on its own; together they can still outgrow what a key may be.
        raise InvalidArgument(
            "source",
            f"gives a routing key of {len(key)} characters; the limit is {MAX_ROUTING_KEY_LEN}: "
            "shorten scope_id, chat_id, thread_id or user_id",
            reason="ROUTING_KEY_TOO_LONG",
        )
    return key


def unbounded_key(agent: str, source: Source, policy: RoutingPolicy | None) -> str:
    """`routing_key` without the bound (for upgrading stored keys, which must learn
    that a key is too long without being refused)."""
    head = [f"agent:{agent}:{source.transport}"]
    if source.transport not in NON_CHAT_TRANSPORTS:
        head.append(CHAT_TYPE_NAMES[source.chat_type])
    ids = [f"{marker}={escaped(value)}" for marker, value in _ids(source, policy) if value]
    return ":".join(head + ids)


def escaped(value: str) -> str:
    """An id with the separator and the escape character percent-encoded."""
    return value.replace("%", "%25").replace(":", "%3A")


def _ids(source: Source, policy: RoutingPolicy | None) -> list[tuple[str, str]]:
    """(marker, id) in key order; empty ids are left out by the caller."""
    if source.transport == PEER:
        return [("from", source.from_agent), ("id", source.conversation_id)]
    if source.transport in NON_CHAT_TRANSPORTS:
        return [("u", source.user_id), ("id", source.conversation_id)]
    ids = [("s", source.scope_id)]
    if source.chat_type == ChatType.DM:
        owner = ("c", source.chat_id) if source.chat_id else ("u", source.user_id)
        return [*ids, owner, ("t", source.thread_id)]
    ids += [("c", source.chat_id), ("t", source.thread_id)]
    policy = policy or RoutingPolicy()
    per_user = not policy.shared_group_sessions and (
        not source.thread_id or policy.per_user_thread_sessions
    )
    if per_user:
        ids.append(("u", source.user_id))
    return ids
