"""Routing keys as releases before the injective encoding built them, and their upgrade.

Those releases joined the bare ids with ':' (`agent:<agent>:<transport>:<chat
type>[:<scope>]:<chat>[:<thread>][:<user>]`, `agent:<agent>:<transport>:<conversation
id>`), so different sources could share a key and a session. The log keeps what
they wrote: their rows are storage format 1, whose `SessionOpened.routing_key` and
snapshotted `Session.routing_key` are such keys. `upgraded_key` gives the key the
current rule (`session_service.routing`) builds for the same session from its
stored source; `storage_format` applies it whenever it reads a format-1 row, so
projections, rebuilds, rewinds and checkouts all see current keys while the log
stays as it was written. The key migration (`session_service.key_migration`)
rewrites the projection rows and routes with it once.

`legacy_key` is a frozen copy of the old rule: never change it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from session_service import routing
from session_service.records import ChatType, RoutingPolicy, Source

#: Every policy: the one that made a stored key is found by trying each.
POLICIES = (
    RoutingPolicy(),
    RoutingPolicy(shared_group_sessions=True),
    RoutingPolicy(per_user_thread_sessions=True),
    RoutingPolicy(shared_group_sessions=True, per_user_thread_sessions=True),
)
#: "<agent>:<context>", as Delegate named its peer conversations (agent-name syntax).
_AGENT_PREFIXED = re.compile(r"([a-z0-9][a-z0-9_-]{0,62}):")


def legacy_key(agent: str, source: Source, policy: RoutingPolicy | None) -> str:
    """The key the release before the injective encoding gave `source` (frozen)."""
    namespace = f"agent:{agent}:{source.transport}"
    if source.transport in routing.NON_CHAT_TRANSPORTS:
        return f"{namespace}:{source.conversation_id}"
    parts = [namespace, routing.CHAT_TYPE_NAMES[source.chat_type]]
    if source.scope_id:
        parts.append(source.scope_id)
    if source.chat_type == ChatType.DM:
        owner = source.chat_id or source.user_id
        parts += [part for part in (owner, source.thread_id) if part]
        return ":".join(parts)
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
    return ":".join(parts)


@dataclass(frozen=True)
class Upgrade:
    #: The session's key now: the current rule's, or the stored key when `kept` says why.
    key: str
    #: The policy that made the stored key (None when none did).
    policy: RoutingPolicy | None = None
    #: The source the new key was built from (a peer source with its sender filled in).
    source: Source | None = None
    #: Why the stored key was kept: "no policy gives it from the source", "too long".
    kept: str = ""


def upgrade(agent: str, key: str, source: Source | None) -> Upgrade:
    """How a session whose format-1 row names it by `key` is keyed now.

    Every policy that gives `key` gives the same new key (policies differ only in
    which ids a key holds, and a key with more ids is longer), so trying them in any
    order finds it. A key no policy gives from the source (written by hand or by an
    older rule) or whose new form is too long is kept: no source routes to it now."""
    if not key or source is None or not source.transport:
        return Upgrade(key)
    chat = source.transport not in routing.NON_CHAT_TRANSPORTS
    if chat and source.chat_type not in routing.CHAT_TYPE_NAMES:
        return Upgrade(key, kept="the session's source has no chat type")
    if source.transport == routing.PEER and not source.from_agent:
        source = replace(source, from_agent=legacy_peer_sender(source))
    for policy in POLICIES:
        if legacy_key(agent, source, policy) != key:
            continue
        new = routing.unbounded_key(agent, source, policy)
        if len(new) > routing.MAX_ROUTING_KEY_LEN:
            return Upgrade(key, policy, source, kept="too long in the new encoding")
        return Upgrade(new, policy, source)
    return Upgrade(key, kept="no routing policy gives it from the session's source")


def upgraded_key(agent: str, key: str, source: Source | None) -> str:
    return upgrade(agent, key, source).key


def legacy_peer_sender(source: Source) -> str:
    """The agent a peer conversation id of an old release names ("" for none):
    Delegate built them as "<agent>:<context>" (so the name is the delegating
    agent's); for SendToPeer it was the caller's word, which the key migration
    checks against the audit trail and reports when it disagrees."""
    found = _AGENT_PREFIXED.match(source.conversation_id)
    return found.group(1) if found else ""
