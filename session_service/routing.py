"""Routing keys: the deterministic, transport-namespaced name of a conversation.

Non-chat transports:  agent:<agent>:<transport>:<conversation_id>
Chat platforms (Hermes' rules):
    agent:<agent>:<platform>:<chat_type>[:<scope_id>]:<chat_id>[:<thread_id>][:<user>]
  - DMs are keyed by the chat id, falling back to the user, then the thread;
    the user never appears beside a chat id.
  - Groups and channels get one session per member unless the agent shares
    them; threads are shared unless the agent isolates them per member.
With PII redaction on, chat ids become `<platform>:<12 hex>`, thread ids
`thread_<12 hex>` and user ids `user_<12 hex>` (`session_service.pii`) before the
key is built, so raw ids never reach the database.
"""

from __future__ import annotations

from dataclasses import replace

from session_service.pii import Redactor
from session_service.records import ChatType, RoutingPolicy, Source
from switchboard import validation
from switchboard.errors import InvalidArgument

NON_CHAT_TRANSPORTS = frozenset({"web", "cron", "repl", "peer"})
#: The routing key column's width (and the ledger's session_key limit).
MAX_ROUTING_KEY_LEN = 512

_CHAT_TYPE_NAMES = {
    ChatType.DM: "dm",
    ChatType.GROUP: "group",
    ChatType.CHANNEL: "channel",
    ChatType.THREAD: "thread",
}


def checked_source(source: Source) -> Source:
    """Validates a source; returns it unchanged."""
    validation.platform("source.transport", source.transport)
    if source.transport in NON_CHAT_TRANSPORTS:
        validation.routing_key("source.conversation_id", source.conversation_id, max_len=256)
        return source
    if source.chat_type not in _CHAT_TYPE_NAMES:
        raise InvalidArgument(
            "source.chat_type", "is required for a chat platform: DM, GROUP, CHANNEL or THREAD"
        )
    for field in ("chat_id", "thread_id", "user_id", "scope_id"):
        value = getattr(source, field)
        if value:
            validation.routing_key(f"source.{field}", value, max_len=256)
    return source


def stored_source(source: Source, redactor: Redactor | None) -> Source:
    """The source as it may be stored: its chat, thread and user ids hashed by
    `redactor` (given when the agent redacts PII). Scope and conversation ids name
    places, not people, and stay as they are."""
    stored = replace(source)
    if redactor is not None and source.transport not in NON_CHAT_TRANSPORTS:
        stored.chat_id = redactor.chat(source.transport, source.chat_id)
        stored.user_id = redactor.user(source.user_id)
        stored.thread_id = redactor.thread(source.thread_id)
    return stored


def routing_key(agent: str, source: Source, policy: RoutingPolicy | None) -> str:
    """The key of a (checked, already redacted if need be) source."""
    namespace = f"agent:{agent}:{source.transport}"
    if source.transport in NON_CHAT_TRANSPORTS:
        return f"{namespace}:{source.conversation_id}"
    chat_type = _CHAT_TYPE_NAMES[source.chat_type]
    parts = [namespace, chat_type]
    if source.scope_id:
        parts.append(source.scope_id)
    if source.chat_type == ChatType.DM:
        owner = source.chat_id or source.user_id
        parts += [part for part in (owner, source.thread_id) if part]
        return _bounded(":".join(parts))
    if source.chat_id:
        parts.append(source.chat_id)
    if source.thread_id:
        parts.append(source.thread_id)
    policy = policy or RoutingPolicy()
    per_user = not policy.shared_group_sessions and (
        not source.thread_id or policy.per_user_thread_sessions
    )
    if per_user and source.user_id:
        parts.append(source.user_id)
    return _bounded(":".join(parts))


def _bounded(key: str) -> str:
    # Each id is bounded on its own; together they can still outgrow what a key may be.
    if len(key) > MAX_ROUTING_KEY_LEN:
        raise InvalidArgument(
            "source",
            f"gives a routing key of {len(key)} characters; the limit is {MAX_ROUTING_KEY_LEN}: "
            "shorten scope_id, chat_id, thread_id or user_id",
            reason="ROUTING_KEY_TOO_LONG",
        )
    return key
