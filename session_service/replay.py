"""Folding events into state: the one definition of what every event means.

Agent state is an `Agent` message, session state a `SessionState` message;
both are rebuilt as "latest snapshot + the entity's later events", so a
snapshot is only ever a cache of this fold.
"""

from __future__ import annotations

from collections.abc import Iterable

from switchboard.session.v1 import session_service_pb2 as pb

#: Agent fields an UpdateAgent may change (top level of the field mask).
UPDATABLE_AGENT_FIELDS = (
    "display_name", "permissions", "workspace_root", "peers", "settings", "parent",
)  # fmt: skip


def apply_to_agent(agent: pb.Agent, event: pb.Event) -> None:
    body = event.WhichOneof("body")
    if body == "agent_created":
        agent.CopyFrom(event.agent_created.agent)
        agent.create_time.CopyFrom(event.time)
    elif body == "agent_updated":
        event.agent_updated.update_mask.MergeMessage(
            event.agent_updated.agent,
            agent,
            replace_message_field=True,
            replace_repeated_field=True,
        )
    elif body == "memory_put":
        agent.memory[event.memory_put.key] = event.memory_put.value
    elif body == "memory_deleted":
        agent.memory.pop(event.memory_deleted.key, None)
    elif body == "agent_archived":
        agent.archived = True
    elif body == "rewind_applied":
        pass  # the state is what the rewind made it; only the version moves
    else:
        raise ValueError(f"event {event.sequence} ({body}) is not an agent event")
    # Events logged before agent versions were recorded count one each.
    agent.version = event.agent_version or agent.version + 1
    agent.last_sequence = event.sequence
    agent.update_time.CopyFrom(event.time)


def apply_to_session(state: pb.SessionState, event: pb.Event) -> None:
    """Applies one session event; `state.session` keeps only the fields the log defines."""
    session = state.session
    body = event.WhichOneof("body")
    if body == "session_opened":
        opened = event.session_opened
        session.session_id = opened.session_id
        session.agent = event.agent
        session.routing_key = opened.routing_key
        session.source.CopyFrom(opened.source)
        session.status = pb.SESSION_STATUS_OPEN
        session.create_time.CopyFrom(event.time)
        session.create_sequence = event.sequence
        session.lineage.CopyFrom(opened.lineage)
        session.narrowing.extend(opened.narrowing)
        session.message_count = opened.inherited_message_count
        state.temp_state.update(opened.temp_state)
        if opened.HasField("task"):
            state.current_task.CopyFrom(opened.task)
    elif body in ("permission_checked", "rewind_applied"):
        pass  # an audit record, or a rewind's version move: the state stays
    elif body == "resume_marked":
        marked = event.resume_marked
        if not marked.pending:
            session.ClearField("resume_marked_time")
        elif not session.resume_pending:
            # Only the first mark sets the time: a turn taken over by another holder is
            # no fresher, or a turn that crashes every gateway would never expire.
            session.resume_marked_time.CopyFrom(event.time)
        session.resume_pending = marked.pending
        session.resume_holder = marked.holder if marked.pending else ""
    elif body == "suspension_changed":
        session.suspended = event.suspension_changed.suspended
    elif body == "session_ended":
        session.status = pb.SESSION_STATUS_ENDED
        session.end_reason = event.session_ended.reason
    elif body == "message_appended":
        session.message_count += 1
    elif body == "inbox_posted":
        state.inbox.add(sequence=event.sequence, message=event.inbox_posted.message)
    elif body == "inbox_drained":
        _drop_through(state.inbox, event.inbox_drained.through_sequence)
    elif body == "outbox_queued":
        state.outbox.add(sequence=event.sequence, message=event.outbox_queued.message)
    elif body == "outbox_acked":
        _drop_through(state.outbox, event.outbox_acked.through_sequence)
    elif body == "task_set":
        state.current_task.CopyFrom(event.task_set.task)
    elif body == "task_cleared":
        state.ClearField("current_task")
    elif body == "temp_state_changed":
        state.temp_state.update(event.temp_state_changed.set)
        for key in event.temp_state_changed.removed:
            state.temp_state.pop(key, None)
    else:
        raise ValueError(f"event {event.sequence} ({body}) is not a session event")
    session.version = event.session_version
    session.last_sequence = event.sequence
    session.update_time.CopyFrom(event.time)


def _drop_through(queue: Iterable[pb.QueuedMessage], through: int) -> None:
    kept = [item for item in queue if item.sequence > through]
    del queue[:]  # type: ignore[attr-defined]
    queue.extend(kept)  # type: ignore[attr-defined]
