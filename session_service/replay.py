"""Folding events into state: the one definition of what every event means.

Agent state is an `Agent` record, session state a `SessionState` record (see
`session_service.records`); both are rebuilt as "latest snapshot + the entity's
later events", so a snapshot is only ever a cache of this fold.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import TypeVar

from session_service import convert
from session_service.records import (
    Agent,
    AgentArchived,
    AgentCreated,
    AgentUpdated,
    Erased,
    Event,
    InboxDrained,
    InboxPosted,
    Lineage,
    MemoryDeleted,
    MemoryPut,
    Message,
    MessageAppended,
    MessagesRetracted,
    OutboxAcked,
    OutboxQueued,
    PermissionChecked,
    QueuedMessage,
    RecordsPut,
    ResumeMarked,
    RewindApplied,
    Session,
    SessionEnded,
    SessionOpened,
    SessionState,
    SessionStatus,
    Source,
    StateChanged,
    SuspensionChanged,
    Task,
    TaskCleared,
    TaskSet,
    TempStateChanged,
)

#: Agent fields an UpdateAgent may change (top level of the field mask).
UPDATABLE_AGENT_FIELDS = (
    "display_name", "permissions", "workspace_root", "peers", "settings", "parent",
)  # fmt: skip


S = TypeVar("S", Agent, SessionState)


def fold(
    kind: type[S], state: S | None, events: Sequence[Event], apply: Callable[[S, Event], None]
) -> S | None:
    """`state` (a snapshot's, or None) with `events` applied in order: a fresh state
    when there is no snapshot, None when there is neither snapshot nor event."""
    if state is None:
        if not events:
            return None
        state = kind()
    for event in events:
        apply(state, event)
    return state


def apply_to_agent(agent: Agent, event: Event) -> None:
    body = event.body
    if isinstance(body, AgentCreated):
        created = copy.deepcopy(body.agent) if body.agent is not None else Agent()
        for field in Agent.__slots__:
            setattr(agent, field, getattr(created, field))
        agent.create_time = event.time or 0
    elif isinstance(body, AgentUpdated):
        convert.merge_masked(body.update_mask or [], body.agent or Agent(), agent)
    elif isinstance(body, MemoryPut):
        agent.memory[body.key] = body.value
    elif isinstance(body, MemoryDeleted):
        agent.memory.pop(body.key, None)
    elif isinstance(body, AgentArchived):
        agent.archived = True
    elif isinstance(body, (RewindApplied, StateChanged)):
        # A rewind's version move; USER- and AGENT-scoped state, which its own read
        # model keeps (`scoped_state`): the agent's state stays.
        pass
    else:
        raise ValueError(f"event {event.sequence} ({body.kind}) is not an agent event")
    # Events logged before agent versions were recorded count one each.
    agent.version = event.agent_version or agent.version + 1
    agent.last_sequence = event.sequence
    agent.update_time = event.time or 0


def apply_to_session(state: SessionState, event: Event) -> None:
    """Applies one session event; `state.session` keeps only the fields the log defines."""
    if state.session is None:
        state.session = Session()
    session = state.session
    body = event.body
    if isinstance(body, SessionOpened):
        session.session_id = body.session_id
        session.agent = event.agent
        session.routing_key = body.routing_key
        session.source = copy.copy(body.source) if body.source is not None else Source()
        session.status = SessionStatus.OPEN
        session.create_time = event.time or 0
        session.create_sequence = event.sequence
        session.lineage = copy.copy(body.lineage) if body.lineage is not None else Lineage()
        session.narrowing.extend(copy.deepcopy(body.narrowing))
        session.message_count = body.inherited_message_count
        state.temp_state.update(body.temp_state)
        if body.task is not None:
            state.current_task = copy.copy(body.task)
    elif isinstance(body, (PermissionChecked, RewindApplied, StateChanged, RecordsPut, Erased)):
        # An audit record, a rewind's version move, scoped state and stored records
        # (each kept by its own read model), a tombstone: the state stays.
        pass
    elif isinstance(body, MessagesRetracted):
        session.message_count = max(0, session.message_count - len(body.sequences))
    elif isinstance(body, ResumeMarked):
        if not body.pending:
            session.resume_marked_time = None
        elif not session.resume_pending:
            # Only the first mark sets the time: a turn taken over by another holder is
            # no fresher, or a turn that crashes every gateway would never expire.
            session.resume_marked_time = event.time or 0
        session.resume_pending = body.pending
        session.resume_holder = body.holder if body.pending else ""
        session.reply_target = body.reply_target if body.pending else b""
    elif isinstance(body, SuspensionChanged):
        session.suspended = body.suspended
    elif isinstance(body, SessionEnded):
        session.status = SessionStatus.ENDED
        session.end_reason = body.reason
    elif isinstance(body, MessageAppended):
        session.message_count += 1
    elif isinstance(body, InboxPosted):
        state.inbox.append(
            QueuedMessage(sequence=event.sequence, message=body.message or Message())
        )
    elif isinstance(body, InboxDrained):
        state.inbox = [item for item in state.inbox if item.sequence > body.through_sequence]
    elif isinstance(body, OutboxQueued):
        state.outbox.append(
            QueuedMessage(sequence=event.sequence, message=body.message or Message())
        )
    elif isinstance(body, OutboxAcked):
        state.outbox = [item for item in state.outbox if item.sequence > body.through_sequence]
    elif isinstance(body, TaskSet):
        state.current_task = copy.copy(body.task) if body.task is not None else Task()
    elif isinstance(body, TaskCleared):
        state.current_task = None
    elif isinstance(body, TempStateChanged):
        state.temp_state.update(body.set)
        for key in body.removed:
            state.temp_state.pop(key, None)
    else:
        raise ValueError(f"event {event.sequence} ({body.kind}) is not a session event")
    session.version = event.session_version
    session.last_sequence = event.sequence
    session.update_time = event.time or 0
