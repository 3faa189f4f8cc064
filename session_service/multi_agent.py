"""Multi-agent work: forks (same identity, branched conversation), delegation and
peer messages (another identity), and the audited permission gate they pass.

A gated call records its decision in the asking session's log. A refusal is
committed as an audit event on its own, then answered PERMISSION_DENIED.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from session_service import convert, permissions, pii, routing
from session_service.agents import Agents
from session_service.checks import (
    agent_name,
    checked_message,
    checked_session_id,
    refuse_unanswerable,
)
from session_service.conversations import Conversations, new_session_id
from session_service.core import Core
from session_service.records import (
    Agent,
    Event,
    Lineage,
    Message,
    Narrowing,
    PermissionChecked,
    Session,
    Source,
)
from switchboard import validation
from switchboard.errors import FailedPrecondition, InvalidArgument, PermissionDenied
from switchboard.idempotency import NotAnAnswer, RequestGuard


@dataclass(frozen=True)
class Refused(NotAnAnswer):
    """A denial, committed as an audit event and carried out of the transaction
    (not remembered under a request id: the caller sees an error)."""

    decision: PermissionChecked


class MultiAgent:
    def __init__(self, core: Core, agents: Agents, conversations: Conversations) -> None:
        self.core = core
        self.agents = agents
        self.conversations = conversations
        self.store = core.store

    # -- the gate ---------------------------------------------------------------------------

    def _decide(
        self, now: float, agent: str, session_id: str, action: str, resource: str
    ) -> tuple[PermissionChecked, int]:
        """Decides for the session and records the decision in its log."""
        owner = self.agents.live_agent(agent)
        index = self.core.open_session_of(agent, session_id)
        state = self.store.states.session_state(session_id)
        assert state is not None and state.session is not None
        # The owner's ancestors, read once: their current rules bound a sub-agent.
        lineage = self.agents.lineage(owner)
        decision = permissions.decide(owner, state.session.narrowing, action, resource, lineage)
        checked = PermissionChecked(
            action=action,
            resource=resource,
            allowed=decision.allowed,
            rule=decision.rule,
            reason=decision.reason,
        )
        event = Event(
            agent=agent,
            session_id=session_id,
            session_version=index.version,  # an audit record: never conflicts with a turn
            body=checked,
        )
        [logged] = self.core.log(now, [event])
        return checked, logged.sequence

    async def check(
        self,
        agent: str,
        session_id: str,
        action: str,
        resource: str,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[PermissionChecked, int]:
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.text("action", action, max_len=256, required=True)
        validation.text("resource", resource, max_len=1024)
        result: tuple[PermissionChecked, int] = await self.core.write(
            lambda now: self._decide(now, agent, session_id, action, resource), guard=guard
        )
        return result

    async def _gated(
        self,
        agent: str,
        session_id: str,
        action: str,
        resource: str,
        then: Callable[[float], Any],
        *,
        guard: RequestGuard | None,
    ) -> Any:
        """Runs `then` in the transaction that records an allow; commits a denial alone."""

        def op(now: float) -> Any:
            decision, _ = self._decide(now, agent, session_id, action, resource)
            if not decision.allowed:
                return Refused(decision)
            return then(now)

        result = await self.core.write(op, guard=guard)
        if isinstance(result, Refused):
            raise PermissionDenied(
                "PERMISSION_DENIED",
                f"{action} on {resource} is not allowed for session {session_id!r}: "
                f"{result.decision.reason}",
                {"rule": result.decision.rule},
            )
        return result

    # -- forks ------------------------------------------------------------------------------

    async def fork(
        self,
        agent: str,
        session_id: str,
        at_sequence: int,
        narrowing: Narrowing,
        *,
        guard: RequestGuard | None = None,
    ) -> Session:
        agent_name("agent", agent)
        checked_session_id(session_id)
        permissions.checked_rules("narrowing.rules", narrowing.rules)

        def op(now: float) -> Session:
            self.agents.live_agent(agent)
            source = self.core.session_of(agent, session_id)
            at = at_sequence or source.last_seq
            if at < source.created_seq or at > self.store.log.head():
                raise InvalidArgument(
                    "at_sequence",
                    f"must lie between the session's creation ({source.created_seq}) and the "
                    "log head",
                )
            if not self.store.log.is_active(at):
                raise FailedPrecondition(
                    "FORK_FROM_ABANDONED", f"sequence {at} lies on an abandoned branch"
                )
            state = self.store.states.session_state(session_id, until=at)
            assert state is not None and state.session is not None
            layers = list(state.session.narrowing)
            if narrowing.rules:
                layers.append(narrowing)
            # The history up to `at` is the parent's (and its ancestors'): read through
            # the lineage, so a fork writes one event whatever the history's length.
            lineage = Lineage(
                parent_session_id=session_id,
                parent_agent=agent,
                forked_at_sequence=at,
                shares_parent_history=True,
            )
            return self.conversations.open_session(
                now,
                agent,
                new_session_id(),
                "",
                state.session.source or Source(),
                dict(state.temp_state),
                lineage=lineage,
                narrowing=layers,
                task=state.current_task,
                inherited_message_count=state.session.message_count,
            )

        result: Session = await self.core.write(op, guard=guard)
        return result

    # -- other agents -----------------------------------------------------------------------

    def _redacts_between(
        self, sender: str, receiver: Agent, message: Message, source: Source | None = None
    ) -> bool:
        """Whether a message between agents is stored with its sender and ref hashed, and
        the chat source it is routed by with its ids hashed: when either agent redacts PII
        (the receiver stores it; the sender's users were promised their ids are not
        kept). The sender's agent is read only when the receiver does not redact and
        there is a raw id to hash."""
        if receiver.settings is not None and receiver.settings.redact_pii:
            return True
        chat_source = source is not None and source.transport not in routing.NON_CHAT_TRANSPORTS
        raw = pii.sender_is_raw(message.sender) or pii.ref_is_raw(message.message_ref)
        if not (chat_source or raw):
            return False
        return self.core.redacts_pii(sender)

    async def delegate(
        self,
        agent: str,
        session_id: str,
        to_agent: str,
        task: Message,
        context: str,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Session, bool, bool]:
        """(the target session, whether this call created it, whether the task was a
        duplicate: its message_ref accepted there before)."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        agent_name("to_agent", to_agent)
        validation.routing_key("context", context or "default", max_len=256)
        checked_message("task", task, self.core.limits.max_content_bytes)
        task = _sent_by(agent, "task", task)
        conversation_id = f"{agent}:{context or 'default'}"
        source = Source(transport=routing.PEER, conversation_id=conversation_id, from_agent=agent)

        def then(now: float) -> tuple[Session, bool, bool]:
            receiver = self.agents.live_agent(to_agent)
            key = routing.routing_key(to_agent, source, None)
            existing = self.store.projections.route(to_agent, key)
            created = existing is None
            if existing is None:
                lineage = Lineage(parent_session_id=session_id, parent_agent=agent, delegated=True)
                existing = self.conversations.open_session(
                    now, to_agent, new_session_id(), key, source, lineage=lineage
                ).session_id
            redact = self._redacts_between(agent, receiver, task)
            _, duplicate = self.conversations.post(now, to_agent, existing, task, redact)
            return self.core.summary(existing), created, duplicate

        result: tuple[Session, bool, bool] = await self._gated(
            agent, session_id, "peer.delegate", f"agent:{to_agent}", then, guard=guard
        )
        return result

    async def send_to_peer(
        self,
        agent: str,
        session_id: str,
        to_agent: str,
        source: Source | None,
        to_session_id: str,
        message: Message,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Event, bool]:
        """(the inbox event in the receiving session, whether it is a duplicate: see
        `Conversations.post`)."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        agent_name("to_agent", to_agent)
        checked_message("message", message, self.core.limits.max_content_bytes)
        message = _sent_by(agent, "message", message)
        if source is not None:
            source = routing.checked_source(source, agent)
        elif to_session_id:
            checked_session_id(to_session_id)
        else:
            raise InvalidArgument("target", "give the receiving session's source or id")
        size = (
            convert.encoded_size(message) + len(to_agent) + len(to_session_id) + 128
        )  # a routed id
        refuse_unanswerable("message", [size], "shorten the message")

        def then(now: float) -> tuple[Event, bool]:
            receiver = self.agents.live_agent(to_agent)
            settings = receiver.settings
            target = to_session_id
            redact = self._redacts_between(agent, receiver, message, source)
            if source is not None:
                # Hashed when either agent redacts: an id a redacting agent saw never
                # leaves it raw (a receiver that does not redact keeps such a chat apart
                # from the one its own gateway routes with raw ids).
                stored = routing.stored_source(source, self.core.redactor if redact else None)
                policy = settings.routing if settings else None
                key = routing.routing_key(to_agent, stored, policy)
                routed = self.conversations.routed_session(to_agent, key, source, stored, policy)
                target = (
                    routed.session_id
                    if routed is not None
                    else self.conversations.open_session(
                        now, to_agent, new_session_id(), key, stored
                    ).session_id
                )
            return self.conversations.post(now, to_agent, target, message, redact)

        result: tuple[Event, bool] = await self._gated(
            agent, session_id, "peer.send", f"agent:{to_agent}", then, guard=guard
        )
        return result


def _sent_by(agent: str, field: str, message: Message) -> Message:
    """A message between agents as stored: sent by the calling agent. An empty sender
    becomes "agent:<agent>"; one naming another agent is refused (the receiver would
    take it for that agent's word); a person's id, relayed by the agent, is kept."""
    own = f"agent:{agent}"
    if not message.sender:
        return replace(message, sender=own)
    if message.sender.startswith("agent:") and message.sender != own:
        raise InvalidArgument(
            f"{field}.sender",
            f"names {message.sender[:80]!r}, but this call is agent {agent!r}'s: a message "
            f"between agents is sent as its calling agent; give {own!r} or leave it empty",
            reason="PEER_SENDER_MISMATCH",
        )
    return message
