"""Reads of sessions: one session, a page of an agent's sessions, a page of
history, the whole state, a snapshot on request, and watching the log."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from session_service import storage_format
from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import (
    Agent,
    AgentSettings,
    Event,
    MessageAppended,
    QueuedMessage,
    Session,
    SessionState,
    SessionStatus,
)
from session_service.scoped_state import ScopedView, view
from session_service.storage.projections import AgentIndex
from switchboard import pagination, validation
from switchboard.errors import InvalidArgument, NotFound, OutOfRange
from switchboard.idempotency import RequestGuard


class SessionReads:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self.runner = core.runner

    async def get_session_with_state(
        self, agent: str, session_id: str
    ) -> tuple[Session, ScopedView]:
        """The session and the scoped state it sees (hook, issue 23), as one state."""
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op() -> tuple[Session, ScopedView]:
            session = self.core.summary(session_id, self.core.session_of(agent, session_id))
            return session, view(self.core.projection.framework.state, session)

        return await self.runner.read(op, consistent=True)

    async def get_session(self, agent: str, session_id: str) -> Session:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op() -> Session:
            return self.core.summary(session_id, self.core.session_of(agent, session_id))

        def summarized() -> Session | None:
            index = self.core.session_of(agent, session_id)
            return None if index.summary is None else self.core.summary(session_id, index)

        # One statement, the row, in the common case; a row without a summary yet (one
        # written by a release before session migration 4) is folded from its snapshot
        # and events, read again in one snapshot.
        found = await self.runner.read(summarized)
        return found if found is not None else await self.runner.read(op, consistent=True)

    async def list_sessions(
        self,
        agent: str,
        status: int,
        transport: str,
        page_size: int,
        page_token: str,
        routing_key: str = "",
        user_id: str = "",
    ) -> tuple[list[Session], str]:
        """A page of the agent's sessions (every agent's for "": the caller's
        authorization decided that it may see them), newest first; `user_id`: only
        that user's (raw: hashed as the agent stores user ids)."""
        if agent:
            agent_name("agent", agent)
        if user_id:
            if not agent:
                raise InvalidArgument("user_id", "filters one agent's sessions: name the agent")
            validation.routing_key("user_id", user_id, max_len=256)
        if status not in set(SessionStatus):
            raise InvalidArgument("status", f"{status} is not a known SessionStatus")
        if transport:
            validation.platform("transport", transport)
        validation.text("routing_key", routing_key, max_len=512)
        size = pagination.page_size(page_size)
        filters = [agent, status, transport]
        if routing_key:  # tokens issued before the filter existed stay valid without it
            filters.append(routing_key)
        if user_id:
            filters.append(["user", user_id])
        position = pagination.position_of(page_token, filters, int)
        before = position[0] if position else None

        def op() -> tuple[list[Session], str]:
            found = self.store.projections.agent_index(agent) if agent else None
            if agent and found is None:
                raise NotFound("AGENT_NOT_FOUND", f"agent {agent!r} does not exist")
            stored_user = user_id
            if user_id and found is not None:  # hook (issue 23): stored as the agent stores it
                redactor = self.core.redactor_for(self._settings(found))
                stored_user = redactor.user(user_id) if redactor else user_id
            rows = self.store.projections.list_sessions(
                agent, status, transport, before, size + 1, routing_key, stored_user
            )
            more = len(rows) > size
            rows = rows[:size]
            sessions = [self.core.summary(row.session_id, row) for row in rows]
            token = pagination.encode([rows[-1].created_seq], filters) if more else ""
            return sessions, token

        # The agent's row, then its sessions': as one state (a rewind may undo both).
        return await self.runner.read(op, consistent=True)

    def _settings(self, index: AgentIndex) -> AgentSettings | None:
        if index.summary is not None:
            return storage_format.decode_agent_summary(index.summary).settings
        agent = self.store.states.agent_state(index.name)
        return None if agent is None else agent.settings

    async def history(
        self,
        agent: str,
        session_id: str,
        after: int,
        limit: int,
        newest: bool,
        include_abandoned: bool = False,
        before: int = 0,
        page_token: str = "",
    ) -> tuple[list[QueuedMessage], str]:
        """A page of the history, oldest first, and the token of the next page in the
        same direction: newer messages, or with `newest` older ones."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.int64("after_sequence", after)
        validation.int64("before_sequence", before)
        size = pagination.page_size(limit)
        filters = ["history", agent, session_id, newest, include_abandoned, after, before]
        position = pagination.position_of(page_token, filters, int)
        if position is not None:  # the bound that moves: the lower one forwards
            after, before = (after, position[0]) if newest else (position[0], before)

        def op() -> tuple[list[QueuedMessage], str]:
            index = self.core.session_of(agent, session_id)
            lineage = self.core.summary(session_id, index).lineage
            shared = lineage is not None and lineage.shares_parent_history
            events, more = self.store.history.history(
                session_id,
                after,
                before or None,
                size,
                newest,
                include_abandoned,
                pagination.MAX_ANSWER_BYTES,
                shared,
            )
            abandoned = (
                self.store.log.abandoned_among([e.sequence for e in events])
                if include_abandoned
                else set()
            )
            messages = [
                QueuedMessage(
                    sequence=e.sequence,
                    message=e.body.message,
                    abandoned=e.sequence in abandoned,
                )
                for e in events
                if isinstance(e.body, MessageAppended)  # what the store's history reads
            ]
            edge = (events[0] if newest else events[-1]).sequence if events else 0
            return messages, pagination.encode([edge], filters) if more else ""

        # The rows' sizes, then the rows that fit: one snapshot, so that a move between
        # the two statements cannot hand back rows the sizes did not count.
        return await self.runner.read(op, consistent=True)

    async def state(
        self, agent: str, session_id: str, at_sequence: int = 0
    ) -> tuple[SessionState, Agent, ScopedView]:
        """The session's and its agent's states now, or as of `at_sequence`: the fold
        of their events active now, up to it; and the scoped state the session sees."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.int64("at_sequence", at_sequence)
        until = at_sequence or None

        def op() -> tuple[SessionState, Agent, ScopedView]:
            self.core.session_of(agent, session_id)
            if until is not None:
                self._check_retained(until)
            state = self.store.states.session_state(session_id, until)
            owner = self.store.states.agent_state(agent, until)
            if state is None or state.session is None or owner is None:
                raise NotFound(
                    "SESSION_NOT_FOUND",
                    f"session {session_id!r} had no active event at or before sequence {until}",
                )
            scoped = view(self.core.projection.framework.state, state.session, until)
            return state, owner, scoped

        # A snapshot and the events after it, twice: a rewind committed between them
        # would fold a snapshot it abandoned with the events it left.
        return await self.runner.read(op, consistent=True)

    def _check_retained(self, sequence: int) -> None:
        head = self.store.log.head()
        if sequence > head:
            raise OutOfRange(
                "SEQUENCE_AHEAD_OF_LOG", f"sequence {sequence} is past the log head {head}"
            )
        retained = self.store.markers.retained_from()
        if sequence < retained:
            raise OutOfRange(
                "REWIND_BEYOND_RETENTION",
                f"sequence {sequence} is below the retained log, which starts at {retained}",
            )

    async def snapshot(
        self, agent: str, session_id: str, *, guard: RequestGuard | None = None
    ) -> int:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op(_now: float) -> int:
            index = self.core.session_of(agent, session_id)
            self.core.projection.snapshot_agent(agent)
            self.store.projections.put_session_index(replace(index, snapshot_version=index.version))
            return self.core.projection.snapshot_session(session_id)

        result: int = await self.core.write(op, guard=guard)
        return result

    def watch(self, after: int, agent: str, session_id: str) -> AsyncIterator[Event]:
        """Events after `after`, then live ones as they commit (`watching.Watching`)."""
        if agent:
            agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)
        validation.int64("after_sequence", after)
        return self.core.watching.watch(after, agent, session_id)
