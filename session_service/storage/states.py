"""An agent's or a session's state read from storage: its latest snapshot and the
events after it, folded by `replay` (the one place that knows what events mean)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from session_service import replay
from session_service.records import Agent, Event, SessionState
from session_service.storage.event_log import EventLog, agent_entity, session_entity
from session_service.storage.snapshots import Snapshots

S = TypeVar("S", Agent, SessionState)


class States:
    def __init__(self, snapshots: Snapshots, log: EventLog) -> None:
        self.snapshots = snapshots
        self.log = log

    def agent_state(self, name: str, until: int | None = None) -> Agent | None:
        return self._state(agent_entity(name), Agent, replay.apply_to_agent, until)

    def session_state(self, session_id: str, until: int | None = None) -> SessionState | None:
        return self._state(session_entity(session_id), SessionState, replay.apply_to_session, until)

    def _state(
        self,
        entity: str,
        kind: type[S],
        apply: Callable[[S, Event], None],
        until: int | None = None,
    ) -> S | None:
        """Latest snapshot + the entity's later events (up to `until`); None for an
        entity with neither. Two statements: the snapshot, the tail."""
        snapshot = self.snapshots.latest_snapshot(entity, kind, until)
        after, state = (0, None) if snapshot is None else snapshot
        tail = self.log.entity_events(entity, after, until)
        return replay.fold(kind, state, tail, apply)
