"""The SessionService's domain core: agents, sessions, routing, the log.

Every change is a typed event appended to the global log by `log`, which
also keeps the projections (agent and session index rows, routes) in the same
transaction through `project`, the one function a rebuild replays too.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

from session_service import freshness, pii, routing
from session_service.agents import Agents
from session_service.checks import (
    MAX_EVENTS_PER_APPEND,
    MAX_SESSION_STATE_BYTES,
    agent_name,
    checked_input,
    checked_message,
    checked_session_id,
    refuse_unanswerable,
)
from session_service.core import Core, SessionLimits
from session_service.log_store import (
    LogStore,
    SessionIndex,
    session_entity,
)
from switchboard import pagination, validation
from switchboard.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2 as pb

#: The events that make a session's state bigger; history messages do not enter it.
_STATE_GROWING = frozenset({"inbox_posted", "outbox_queued", "task_set", "temp_state_changed"})


def new_session_id() -> str:
    return f"s_{uuid.uuid4().hex}"


class Sessions(Core):
    def __init__(
        self,
        runner: TransactionRunner,
        store: LogStore,
        limits: SessionLimits,
        redactor: pii.Redactor | None = None,
    ) -> None:
        super().__init__(runner, store, limits, redactor)
        self.agents = Agents(self)

    # == the log ===========================================================================

    # == agents ============================================================================

    # == sessions: routing and lifecycle ===================================================

    def open_session(
        self,
        now: float,
        agent: str,
        session_id: str,
        routing_key: str,
        source: pb.Source,
        temp_state: dict[str, str] | None = None,
        *,
        lineage: pb.Lineage | None = None,
        narrowing: Sequence[pb.Narrowing] = (),
        task: pb.Task | None = None,
        inherited_message_count: int = 0,
    ) -> pb.Session:
        """Logs a new session, its whole initial state in one event (a fork's history
        is its parent's, read through `lineage`, never copied)."""
        opened = pb.SessionOpened(
            session_id=session_id,
            routing_key=routing_key,
            source=source,
            temp_state=temp_state,
            lineage=lineage,
            narrowing=narrowing,
            task=task,
            inherited_message_count=inherited_message_count,
        )
        # Above any version a session of this id ever had (one a rewind undid, say).
        first = self.store.highest_version(session_entity(session_id)) + 1
        event = pb.Event(
            agent=agent, session_id=session_id, session_version=first, session_opened=opened
        )
        self.log(now, [event])
        return self.summary(session_id)

    async def resolve(
        self, agent: str, source: pb.Source, session_id: str
    ) -> tuple[pb.Session, bool]:
        agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)

            def join() -> tuple[pb.Session, bool]:
                self.agents.live_agent_summary(agent)
                index = self.open_session_of(agent, session_id)
                return self.summary(session_id, index), False

            return await self.runner.read(join)
        routing.checked_source(source)

        def op(now: float) -> tuple[pb.Session, bool]:
            # An existing route costs two statements after the log lock: the agent's
            # row, then the route joined with its session's row.
            settings = self.agents.live_agent_summary(agent).settings
            stored = routing.stored_source(source, self.redactor_for(settings))
            key = routing.routing_key(agent, stored, settings.routing)
            existing = self.store.routed_session(agent, key)
            if existing is not None:
                current = self.summary(existing.session_id, existing)
                reason = freshness.reset_reason(settings, current, now)
                if reason is None:
                    return current, False
                return self.reset_now(now, agent, existing.session_id, reason), True
            new_id = new_session_id()
            # Single flight: the first to take the route creates the session;
            # a concurrent resolver (another replica too) finds the route taken.
            if not self.store.claim_route(agent, key, new_id):
                taken = self.store.route(agent, key)
                assert taken is not None
                return self.summary(taken), False
            return self.open_session(now, agent, new_id, key, stored), True

        result: tuple[pb.Session, bool] = await self.write(op)
        return result

    async def spawn(
        self, agent: str, session_id: str, temp_state: dict[str, str], *, any_id: bool
    ) -> pb.Session:
        """`any_id`: the caller may choose any session id (admin, or authentication
        off); others only ids in the agent's namespace, so that a taken id is never
        another agent's session."""
        agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)
            prefix = f"{agent}."
            if not any_id and (not session_id.startswith(prefix) or session_id == prefix):
                raise InvalidArgument(
                    "session_id",
                    f"must be {agent!r} followed by '.' and a name of your choice "
                    f"(e.g. '{agent}.nightly'): this token may choose ids in its agent's "
                    "namespace only; or leave it empty for a generated id",
                    reason="SESSION_ID_NAMESPACE",
                )
        validation.string_map("temp_state", temp_state, max_entries=1000)
        chosen = session_id or new_session_id()

        def op(now: float) -> pb.Session:
            self.agents.live_agent_summary(agent)
            if self.store.session_index(chosen) is not None:
                raise AlreadyExists("SESSION_EXISTS", f"session {chosen!r} exists already")
            return self.open_session(now, agent, chosen, "", pb.Source(), temp_state)

        result: pb.Session = await self.write(op)
        return result

    async def get_session(self, agent: str, session_id: str) -> pb.Session:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op() -> pb.Session:
            return self.summary(session_id, self.session_of(agent, session_id))

        return await self.runner.read(op)

    async def list_sessions(
        self, agent: str, status: int, transport: str, page_size: int, page_token: str
    ) -> tuple[list[pb.Session], str]:
        agent_name("agent", agent)
        if status not in pb.SessionStatus.values():
            raise InvalidArgument("status", f"{status} is not a known SessionStatus")
        if transport:
            validation.platform("transport", transport)
        size = pagination.page_size(page_size)
        filters = [agent, status, transport]
        position = pagination.position_of(page_token, filters, int)
        before = position[0] if position else None

        def op() -> tuple[list[pb.Session], str]:
            if self.store.agent_index(agent) is None:
                raise NotFound("AGENT_NOT_FOUND", f"agent {agent!r} does not exist")
            rows = self.store.list_sessions(agent, status, transport, before, size + 1)
            more = len(rows) > size
            rows = rows[:size]
            sessions = [self.summary(row.session_id, row) for row in rows]
            token = pagination.encode([rows[-1].created_seq], filters) if more else ""
            return sessions, token

        return await self.runner.read(op)

    async def end(self, agent: str, session_id: str, reason: str) -> pb.Session:
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.text("reason", reason, max_len=256)

        def op(now: float) -> pb.Session:
            index = self.session_of(agent, session_id)
            if index.status == pb.SESSION_STATUS_OPEN:
                self.log(now, [self._ended_event(index, reason)])
            return self.summary(session_id)

        result: pb.Session = await self.write(op)
        return result

    def _ended_event(self, index: SessionIndex, reason: str) -> pb.Event:
        return pb.Event(
            agent=index.agent,
            session_id=index.session_id,
            session_version=index.version + 1,
            session_ended=pb.SessionEnded(reason=reason),
        )

    async def reset(
        self, agent: str, session_id: str, reason: str
    ) -> tuple[pb.Session, pb.Session]:
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.text("reason", reason, max_len=256)

        def op(now: float) -> tuple[pb.Session, pb.Session]:
            self.agents.live_agent_summary(agent)
            fresh = self.reset_now(now, agent, session_id, reason or "reset")
            return self.summary(session_id), fresh

        result: tuple[pb.Session, pb.Session] = await self.write(op)
        return result

    def reset_now(self, now: float, agent: str, session_id: str, reason: str) -> pb.Session:
        """Ends a session with a reason and opens a fresh one on its routing key."""
        index = self.open_session_of(agent, session_id)
        old = self.summary(session_id, index)
        self.log(now, [self._ended_event(index, reason)])
        return self.open_session(now, agent, new_session_id(), index.routing_key, old.source)

    # == sessions: appending ===============================================================

    async def append(
        self,
        agent: str,
        session_id: str,
        expected_version: int | None,
        inputs: Sequence[pb.SessionEventInput],
        echo: bool = True,
    ) -> tuple[list[pb.Event], int, list[int]]:
        """(the events as logged, or none without `echo`; the version; their sequences).
        An echo that would not fit one answer is refused before anything is written."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        if not inputs or len(inputs) > MAX_EVENTS_PER_APPEND:
            raise InvalidArgument("events", f"give 1 to {MAX_EVENTS_PER_APPEND} events")
        bodies = [
            checked_input(i, event, self.limits.max_content_bytes) for i, event in enumerate(inputs)
        ]
        if echo:
            sizes = [event.ByteSize() + len(agent) + len(session_id) for event in inputs]
            refuse_unanswerable("events", sizes, "set sequences_only, or split the append")

        def op(now: float) -> tuple[list[pb.Event], int, list[int]]:
            index = self.open_session_of(agent, session_id)
            if expected_version is not None and expected_version != index.version:
                raise Aborted(
                    "VERSION_MISMATCH",
                    f"session {session_id!r} is at version {index.version}, not "
                    f"{expected_version}: re-read it and retry",
                    {"version": str(index.version)},
                )
            events = []
            for offset, (name, body) in enumerate(bodies):
                event = pb.Event(
                    agent=agent, session_id=session_id, session_version=index.version + offset + 1
                )
                getattr(event, name).CopyFrom(body)
                events.append(event)
            self.redact_senders(agent, events)
            self._refuse_state_growth_past_limit(session_id, events)
            logged = self.log(now, events, index)
            sequences = [event.sequence for event in logged]
            return (logged if echo else []), index.version + len(events), sequences

        result: tuple[list[pb.Event], int, list[int]] = await self.write(op)
        return result

    async def post_to_inbox(self, agent: str, session_id: str, message: pb.Message) -> pb.Event:
        agent_name("agent", agent)
        checked_session_id(session_id)
        checked_message("message", message, self.limits.max_content_bytes)
        size = message.ByteSize() + len(agent) + len(session_id)
        refuse_unanswerable("message", [size], "shorten the message")

        result: pb.Event = await self.write(lambda now: self.post(now, agent, session_id, message))
        return result

    def post(
        self,
        now: float,
        agent: str,
        session_id: str,
        message: pb.Message,
        redact: bool | None = None,
    ) -> pb.Event:
        """Puts a message into an open session's inbox (in the caller's transaction).
        `redact`: whether its sender is hashed (None: as the agent's settings say)."""
        index = self.open_session_of(agent, session_id)
        posted = pb.Event(
            agent=agent,
            session_id=session_id,
            session_version=index.version,  # unversioned: never conflicts with a turn
            inbox_posted=pb.InboxPosted(message=message),
        )
        self.redact_senders(agent, [posted], redact)
        self._refuse_state_growth_past_limit(session_id, [posted])
        return self.log(now, [posted], index)[0]

    # == personal ids ======================================================================

    def _refuse_state_growth_past_limit(self, session_id: str, events: Sequence[pb.Event]) -> None:
        growth = sum(e.ByteSize() for e in events if e.WhichOneof("body") in _STATE_GROWING)
        if not growth:
            return  # plain history appends never read the state: the hot path stays cheap
        state = self.store.session_state(session_id)
        assert state is not None
        if state.ByteSize() + growth > MAX_SESSION_STATE_BYTES:
            raise FailedPrecondition(
                "SESSION_STATE_TOO_LARGE",
                f"session {session_id!r} would hold more than {MAX_SESSION_STATE_BYTES} bytes "
                "of inbox, outbox, task and temp state: drain the inbox (inbox_drained) or "
                "acknowledge the outbox (outbox_acked) first",
            )

    # == sessions: reading =================================================================

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
    ) -> tuple[list[pb.QueuedMessage], str]:
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

        def op() -> tuple[list[pb.QueuedMessage], str]:
            index = self.session_of(agent, session_id)
            shared = self.summary(session_id, index).lineage.shares_parent_history
            events, more = self.store.history(
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
                self.store.abandoned_among([e.sequence for e in events])
                if include_abandoned
                else set()
            )
            messages = [
                pb.QueuedMessage(
                    sequence=e.sequence,
                    message=e.message_appended.message,
                    abandoned=e.sequence in abandoned,
                )
                for e in events
            ]
            edge = (events[0] if newest else events[-1]).sequence if events else 0
            return messages, pagination.encode([edge], filters) if more else ""

        return await self.runner.read(op)

    async def state(self, agent: str, session_id: str) -> tuple[pb.SessionState, pb.Agent]:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op() -> tuple[pb.SessionState, pb.Agent]:
            self.session_of(agent, session_id)
            state = self.store.session_state(session_id)
            owner = self.store.agent_state(agent)
            assert state is not None and owner is not None
            return state, owner

        return await self.runner.read(op)

    async def snapshot(self, agent: str, session_id: str) -> int:
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op(_now: float) -> int:
            index = self.session_of(agent, session_id)
            self.projection.snapshot_agent(agent)
            self.store.put_session_index(replace(index, snapshot_version=index.version))
            return self.projection.snapshot_session(session_id)

        result: int = await self.runner.write(op)
        return result

    def watch(self, after: int, agent: str, session_id: str) -> AsyncIterator[pb.Event]:
        """Events after `after`, then live ones as they commit (`watching.Watching`)."""
        if agent:
            agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)
        validation.int64("after_sequence", after)
        return self.watching.watch(after, agent, session_id)
