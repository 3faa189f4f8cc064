"""Routing keys built offline, by the SessionService's rule.

For a gateway that needs a conversation's key without asking the service (to name
its ledger rows before the session exists, say). The service is the authority: what
it answers in `Session.routing_key` is the key. The rule, checked against the
published vectors (protos/testdata/session_keys.json), is injective:

    agent:<agent>:<transport>:<chat type>[:s=<scope>][:c=<chat>][:t=<thread>][:u=<user>]
    agent:<agent>:<transport>[:u=<user>]:id=<conversation id>        web, cron, repl, frameworks
    agent:<agent>:peer:from=<from_agent>:id=<conversation id>         peer

with '%' and ':' in every id written '%25' and '%3A'. The agent frameworks' transports
("adk", "openai_agents", "langgraph") are non-chat ones. Build from the source as the
service stores it: for an agent that redacts PII its chat, thread and user ids are
hashed with the service's PII key first (so such keys need that key); a peer source
names its sending agent in `from_agent`.
"""

from __future__ import annotations

from switchboard.session.v1 import session_service_pb2 as pb

#: The agent frameworks' session stores (Google ADK, OpenAI Agents, LangGraph).
FRAMEWORK_TRANSPORTS = frozenset({"adk", "openai_agents", "langgraph"})
NON_CHAT_TRANSPORTS = frozenset({"web", "cron", "repl", "peer"}) | FRAMEWORK_TRANSPORTS
MAX_ROUTING_KEY_LEN = 512
_CHAT_TYPE_NAMES = {
    pb.CHAT_TYPE_DM: "dm",
    pb.CHAT_TYPE_GROUP: "group",
    pb.CHAT_TYPE_CHANNEL: "channel",
    pb.CHAT_TYPE_THREAD: "thread",
}


def routing_key(agent: str, source: pb.Source, policy: pb.RoutingPolicy | None = None) -> str:
    """The key the service gives `source` (as stored) for `agent` under `policy`.
    Raises ValueError for a source the service would refuse to route."""
    head = [f"agent:{agent}:{source.transport}"]
    if source.transport not in NON_CHAT_TRANSPORTS:
        if source.chat_type not in _CHAT_TYPE_NAMES:
            raise ValueError("a chat source needs chat_type DM, GROUP, CHANNEL or THREAD")
        head.append(_CHAT_TYPE_NAMES[source.chat_type])
    elif source.transport == "peer" and not source.from_agent:
        raise ValueError("a peer source needs from_agent: the agent that sends into it")
    ids = [f"{marker}={escaped(value)}" for marker, value in _ids(source, policy) if value]
    key = ":".join(head + ids)
    if len(key) > MAX_ROUTING_KEY_LEN:
        raise ValueError(f"the key has {len(key)} characters; the limit is {MAX_ROUTING_KEY_LEN}")
    return key


def escaped(value: str) -> str:
    """An id with the separator and the escape character percent-encoded."""
    return value.replace("%", "%25").replace(":", "%3A")


def _ids(source: pb.Source, policy: pb.RoutingPolicy | None) -> list[tuple[str, str]]:
    if source.transport == "peer":
        return [("from", source.from_agent), ("id", source.conversation_id)]
    if source.transport in NON_CHAT_TRANSPORTS:
        return [("u", source.user_id), ("id", source.conversation_id)]
    ids = [("s", source.scope_id)]
    if source.chat_type == pb.CHAT_TYPE_DM:
        owner = ("c", source.chat_id) if source.chat_id else ("u", source.user_id)
        return [*ids, owner, ("t", source.thread_id)]
    ids += [("c", source.chat_id), ("t", source.thread_id)]
    policy = policy or pb.RoutingPolicy()
    per_user = not policy.shared_group_sessions and (
        not source.thread_id or policy.per_user_thread_sessions
    )
    if per_user:
        ids.append(("u", source.user_id))
    return ids
