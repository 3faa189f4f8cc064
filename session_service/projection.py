"""The projections of the log, written once: the agent and session index rows,
their summaries, routes, lineage and snapshots.

`project` folds logged events onto the rows (each append, and the full rebuild);
`refresh_*` rewrite the rows a rewind or checkout changed from the entities' whole
states. Those do not go through `project`: a row's summary is a fold of every
event it saw, abandoned ones included, so after a move it can only be rebuilt
from the state, and replaying the active log through `project` instead would read
each touched entity's whole history (what the rewind avoids) and change which
snapshots are written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from session_service import replay, storage_format
from session_service.framework_projection import FrameworkProjection
from session_service.records import (
    Agent,
    AgentArchived,
    AgentCreated,
    Event,
    ResumeMarked,
    SessionEnded,
    SessionOpened,
    SessionState,
    SessionStatus,
)
from session_service.storage.event_log import agent_entity, session_entity
from session_service.storage.projections import (
    AgentIndex,
    SessionIndex,
    agent_summary,
    serialized_summary,
)
from session_service.storage.store import SessionStore


class _SummaryFolds:
    """The summaries of the rows one `project` call touches, each parsed from its row
    once, folded on with the events (the same fold as a state's), serialized once.
    A row without a summary (None) stays without one: the store folds it whole."""

    def __init__(self) -> None:
        self._sessions: dict[str, SessionState | None] = {}
        self._agents: dict[str, Agent | None] = {}

    def session(self, event: Event, index: SessionIndex) -> None:
        if event.session_id not in self._sessions or isinstance(event.body, SessionOpened):
            summary = index.summary
            self._sessions[event.session_id] = (
                None
                if summary is None
                else SessionState(session=storage_format.decode_session_summary(summary))
            )
        state = self._sessions[event.session_id]
        if state is not None:
            # Only `session` is kept: the rest of this partial state is left behind.
            replay.apply_to_session(state, event)

    def agent(self, event: Event, index: AgentIndex) -> None:
        created = isinstance(event.body, AgentCreated)
        if event.agent not in self._agents or created:
            summary = b"" if created else index.summary
            self._agents[event.agent] = (
                None if summary is None else storage_format.decode_agent_summary(summary)
            )
        agent = self._agents[event.agent]
        if agent is not None:
            replay.apply_to_agent(agent, event)
            agent.memory = {}

    def session_summary(self, session_id: str) -> bytes | None:
        state = self._sessions.get(session_id)
        return None if state is None or state.session is None else serialized_summary(state.session)

    def agent_summary(self, name: str) -> bytes | None:
        agent = self._agents.get(name)
        return None if agent is None else serialized_summary(agent)


class Projection:
    def __init__(self, store: SessionStore, snapshot_every: int) -> None:
        self.store = store
        #: A snapshot is written when an entity has this many events since its last one.
        self.snapshot_every = snapshot_every
        #: Hook (issue 23): the read models of scoped state, stored records,
        #: retractions and sessions by user, kept with the same events.
        self.framework = FrameworkProjection(store.backend)

    def project(
        self,
        events: Sequence[Event],
        snapshot: bool = False,
        known: SessionIndex | None = None,
    ) -> None:
        """Updates the index rows and routes for logged events (also what a rebuild
        replays): each touched row is read once and written once per call, its
        summary folded on from the row's (never re-read from the log)."""
        sessions: dict[str, SessionIndex] = {} if known is None else {known.session_id: known}
        agents: dict[str, AgentIndex] = {}
        folds = _SummaryFolds()
        for event in events:
            if event.session_id:
                self._project_session(event, sessions)
                folds.session(event, sessions[event.session_id])
            else:
                self._project_agent(event, agents)
                folds.agent(event, agents[event.agent])
        every = self.snapshot_every
        for index in sessions.values():
            index = replace(index, summary=folds.session_summary(index.session_id))
            if snapshot and index.version - index.snapshot_version >= every:
                self.snapshot_session(index.session_id)
                index = replace(index, snapshot_version=index.version)
            self.store.projections.put_session_index(index)
        for agent in agents.values():
            agent = replace(agent, summary=folds.agent_summary(agent.name))
            if snapshot and agent.version - agent.snapshot_version >= every:
                self.snapshot_agent(agent.name)
                agent = replace(agent, snapshot_version=agent.version)
            self.store.projections.put_agent_index(agent)
        self.framework.project(events)  # hook (issue 23): see `framework_projection`

    def number_agent_events(self, events: Sequence[Event]) -> None:
        """Gives agent events their agent's next versions: above every version the
        agent ever had, also when it is created again after a rewind undid it."""
        versions: dict[str, int] = {}
        for event in events:
            if event.session_id:
                continue
            if event.agent not in versions:
                index = self.store.projections.agent_index(event.agent)
                versions[event.agent] = (
                    index.version
                    if index is not None
                    else self.store.markers.highest_version(agent_entity(event.agent))
                )
            versions[event.agent] += 1
            event.agent_version = versions[event.agent]

    def _project_agent(self, event: Event, agents: dict[str, AgentIndex]) -> None:
        current = agents.get(event.agent) or self.store.projections.agent_index(event.agent)
        counted = 1 if current is None else current.version + 1  # events from before versions
        agents[event.agent] = AgentIndex(
            name=event.agent,
            archived=isinstance(event.body, AgentArchived) or bool(current and current.archived),
            version=event.agent_version or counted,
            last_seq=event.sequence,
            snapshot_version=0 if current is None else current.snapshot_version,
            summary=None if current is None else current.summary,
        )

    def _project_session(self, event: Event, sessions: dict[str, SessionIndex]) -> None:
        body = event.body
        if isinstance(body, SessionOpened):
            opened = body
            sessions[event.session_id] = SessionIndex(
                session_id=event.session_id,
                agent=event.agent,
                routing_key=opened.routing_key,
                transport=opened.source.transport if opened.source is not None else "",
                status=SessionStatus.OPEN,
                created_seq=event.sequence,
                last_seq=event.sequence,
                version=event.session_version,
                snapshot_version=0,
                summary=b"",  # a new session's summary starts empty
            )
            if opened.routing_key:
                self.store.projections.set_route(event.agent, opened.routing_key, event.session_id)
            lineage = opened.lineage
            if lineage is not None and lineage.shares_parent_history:
                self.store.projections.add_lineage(
                    event.session_id, lineage.parent_session_id, lineage.forked_at_sequence
                )
            return
        current = sessions.get(event.session_id) or self.store.projections.session_index(
            event.session_id
        )
        assert current is not None, f"event {event.sequence} for an unknown session"
        changed = replace(current, last_seq=event.sequence, version=event.session_version)
        if isinstance(body, ResumeMarked):
            changed = replace(changed, resume_pending=body.pending)
        elif isinstance(body, SessionEnded):
            changed = replace(changed, status=SessionStatus.ENDED)
            if current.routing_key:
                self.store.projections.drop_route(
                    event.agent, current.routing_key, event.session_id
                )
        sessions[event.session_id] = changed

    def snapshot_session(self, session_id: str) -> int:
        state = self.store.states.session_state(session_id)
        assert state is not None and state.session is not None
        sequence = state.session.last_sequence
        self.store.snapshots.save_snapshot(session_entity(session_id), sequence, state)
        return sequence

    def snapshot_agent(self, name: str) -> None:
        agent = self.store.states.agent_state(name)
        assert agent is not None
        self.store.snapshots.save_snapshot(agent_entity(name), agent.last_sequence, agent)

    def refresh_sessions(self, states: dict[str, SessionState | None]) -> None:
        """Rewrites the rows of sessions whose active events a rewind or checkout
        changed, from their whole states (None: the session no longer exists)."""
        self.store.projections.drop_routes_to(states)
        # Parents before their forks: a fork's lineage copies its parent's.
        order = sorted(
            states.items(),
            key=lambda item: item[1].session.create_sequence if item[1] and item[1].session else 0,
        )
        for session_id, state in order:
            if state is None:
                self.store.projections.delete_session_index(session_id)  # created after the cut
                continue
            session = state.session
            assert session is not None
            # The state is at hand, and the index says it is snapshotted: without the
            # snapshot, reads after many rewinds would replay the whole active log.
            self.store.snapshots.save_snapshot(
                session_entity(session_id), session.last_sequence, state
            )
            self.store.projections.put_session_index(
                SessionIndex(
                    session_id=session_id,
                    agent=session.agent,
                    routing_key=session.routing_key,
                    transport=session.source.transport if session.source is not None else "",
                    status=session.status,
                    created_seq=session.create_sequence,
                    last_seq=session.last_sequence,
                    version=session.version,
                    snapshot_version=session.version,
                    resume_pending=session.resume_pending,
                    summary=serialized_summary(session),
                )
            )
            if session.routing_key and session.status == SessionStatus.OPEN:
                self.store.projections.set_route(session.agent, session.routing_key, session_id)
            lineage = session.lineage
            if lineage is not None and lineage.shares_parent_history:  # a fork a checkout restored
                self.store.projections.add_lineage(
                    session_id, lineage.parent_session_id, lineage.forked_at_sequence
                )

    def refresh_agent(self, name: str, agent: Agent | None) -> None:
        """Rewrites an agent's row from its whole state (None: it no longer exists)."""
        if agent is None:
            self.store.projections.delete_agent_index(name)  # created after the cut
            return
        self.store.snapshots.save_snapshot(agent_entity(name), agent.last_sequence, agent)
        self.store.projections.put_agent_index(
            AgentIndex(
                name=name,
                archived=agent.archived,
                version=agent.version,
                last_seq=agent.last_sequence,
                snapshot_version=agent.version,
                summary=serialized_summary(agent_summary(agent)),
            )
        )
