"""Conversations: opening sessions (routing, spawning), appending to them, their
inboxes, and ending or resetting them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

from session_service import convert, freshness, routing
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
from session_service.core import Core
from session_service.records import (
    Event,
    EventInput,
    InboxPosted,
    Lineage,
    Message,
    Narrowing,
    OutboxQueued,
    ResumeMarked,
    RoutingPolicy,
    Session,
    SessionEnded,
    SessionOpened,
    SessionStatus,
    Source,
    StateChanged,
    Task,
    TaskSet,
    TempStateChanged,
)
from session_service.scoped_state import ScopedState, checked_deltas
from session_service.storage.erasure_store import ErasureStore
from session_service.storage.event_log import session_entity
from session_service.storage.projections import SessionIndex
from switchboard import validation
from switchboard.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from switchboard.idempotency import RequestGuard

#: The events that make a session's state bigger; history messages do not enter it.
_STATE_GROWING = (InboxPosted, OutboxQueued, TaskSet, TempStateChanged)


def new_session_id() -> str:
    return f"s_{uuid.uuid4().hex}"


class Conversations:
    def __init__(self, core: Core, agents: Agents) -> None:
        self.core = core
        self.agents = agents
        self.store = core.store
        self.runner = core.runner
        # Hooks (issue 23): state deltas with appends; erased ids and keys remembered.
        self.scoped = ScopedState(core, agents)
        self.erased = ErasureStore(core.store.backend, core.redactor)

    def open_session(
        self,
        now: float,
        agent: str,
        session_id: str,
        routing_key: str,
        source: Source,
        temp_state: dict[str, str] | None = None,
        *,
        lineage: Lineage | None = None,
        narrowing: Sequence[Narrowing] = (),
        task: Task | None = None,
        inherited_message_count: int = 0,
    ) -> Session:
        """Logs a new session, its whole initial state in one event (a fork's history
        is its parent's, read through `lineage`, never copied)."""
        opened = SessionOpened(
            session_id=session_id,
            routing_key=routing_key,
            source=source,
            temp_state=dict(temp_state or {}),
            lineage=lineage,
            narrowing=list(narrowing),
            task=task,
            inherited_message_count=inherited_message_count,
        )
        # Above any version a session of this id ever had (one a rewind undid, say).
        first = self.store.markers.highest_version(session_entity(session_id)) + 1
        event = Event(agent=agent, session_id=session_id, session_version=first, body=opened)
        self.core.log(now, [event])
        return self.core.summary(session_id)

    async def resolve(
        self,
        agent: str,
        source: Source,
        session_id: str,
        lookup_only: bool = False,
        reopen_erased: bool = False,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Session, bool]:
        """`lookup_only`: answer the routed session or NOT_FOUND, writing nothing;
        `reopen_erased`: open a new session on a key whose session was erased."""
        agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)

            def join() -> tuple[Session, bool]:
                self.agents.live_agent_summary(agent)
                index = self.core.open_session_of(agent, session_id)
                return self.core.summary(session_id, index), False

            return await self.runner.read(join, consistent=True)  # the agent's row, the session's
        source = routing.checked_source(source, agent)

        def look() -> tuple[Session, bool]:
            settings = self.agents.live_agent_summary(agent).settings
            stored = routing.stored_source(source, self.core.redactor_for(settings))
            policy = settings.routing if settings else None
            key = routing.routing_key(agent, stored, policy)
            existing = self.routed_session(agent, key, source, stored, policy)
            if existing is None:
                raise NotFound(
                    "SESSION_NOT_FOUND",
                    f"agent {agent!r} has no session for this source (routing key {key!r})",
                )
            return self.core.summary(existing.session_id, existing), False

        if lookup_only:  # hook (issue 23): a read, never a write
            return await self.runner.read(look, consistent=True)

        def op(now: float) -> tuple[Session, bool]:
            # An existing route costs two statements after the log lock: the agent's
            # row, then the route joined with its session's row.
            settings = self.agents.live_agent_summary(agent).settings
            stored = routing.stored_source(source, self.core.redactor_for(settings))
            policy = settings.routing if settings else None
            key = routing.routing_key(agent, stored, policy)
            existing = self.routed_session(agent, key, source, stored, policy)
            if existing is not None:
                current = self.core.summary(existing.session_id, existing)
                reason = freshness.reset_reason(settings, current, now)
                if reason is None:
                    return current, False
                return self.reset_now(now, agent, existing.session_id, reason), True
            self._refuse_erased_key(agent, key, reopen_erased)  # hook (issue 23)
            new_id = new_session_id()
            # Single flight: the first to take the route creates the session;
            # a concurrent resolver (another replica too) finds the route taken.
            if not self.store.projections.claim_route(agent, key, new_id):
                taken = self.store.projections.route(agent, key)
                assert taken is not None
                return self.core.summary(taken), False
            return self.open_session(now, agent, new_id, key, stored), True

        result: tuple[Session, bool] = await self.core.write(op, guard=guard)
        return result

    async def spawn(
        self,
        agent: str,
        session_id: str,
        temp_state: dict[str, str],
        *,
        any_id: bool,
        reopen_erased: bool = False,
        guard: RequestGuard | None = None,
    ) -> Session:
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

        def op(now: float) -> Session:
            self.agents.live_agent_summary(agent)
            if self.store.projections.session_index(chosen) is not None:
                raise AlreadyExists("SESSION_EXISTS", f"session {chosen!r} exists already")
            self._refuse_erased_id(chosen, reopen_erased)  # hook (issue 23)
            return self.open_session(now, agent, chosen, "", Source(), temp_state)

        result: Session = await self.core.write(op, guard=guard)
        return result

    async def end(
        self, agent: str, session_id: str, reason: str, *, guard: RequestGuard | None = None
    ) -> Session:
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.text("reason", reason, max_len=256)

        def op(now: float) -> Session:
            index = self.core.session_of(agent, session_id)
            if index.status == SessionStatus.OPEN:
                self.core.log(now, [self._ended_event(index, reason)])
            return self.core.summary(session_id)

        result: Session = await self.core.write(op, guard=guard)
        return result

    def _ended_event(self, index: SessionIndex, reason: str) -> Event:
        return Event(
            agent=index.agent,
            session_id=index.session_id,
            session_version=index.version + 1,
            body=SessionEnded(reason=reason),
        )

    async def reset(
        self, agent: str, session_id: str, reason: str, *, guard: RequestGuard | None = None
    ) -> tuple[Session, Session]:
        agent_name("agent", agent)
        checked_session_id(session_id)
        validation.text("reason", reason, max_len=256)

        def op(now: float) -> tuple[Session, Session]:
            self.agents.live_agent_summary(agent)
            fresh = self.reset_now(now, agent, session_id, reason or "reset")
            return self.core.summary(session_id), fresh

        result: tuple[Session, Session] = await self.core.write(op, guard=guard)
        return result

    def routed_session(
        self,
        agent: str,
        key: str,
        source: Source,
        stored: Source,
        policy: RoutingPolicy | None,
    ) -> SessionIndex | None:
        """The session `key` (of `source`, stored as `stored`) routes to. A redacting
        agent's conversation in a thread that began before thread ids were hashed is
        keyed with its raw thread: found by that key, it keeps its session (until a
        reset opens the next one under `key`, see `reset_now`). The second look costs
        a statement only when `key` routes nowhere and the thread was hashed."""
        found = self.store.projections.routed_session(agent, key)
        if found is not None:
            return found
        before_hashing = routing.key_with_raw_thread(agent, source, stored, policy)
        if before_hashing is not None:
            return self.store.projections.routed_session(agent, before_hashing)
        # Hook (issue 23): a web, cron or repl conversation with a user, opened before
        # users were key components, keeps its session under its key without u=.
        without_user = routing.key_without_user(agent, stored, policy)
        return (
            None
            if without_user is None
            else self.store.projections.routed_session(agent, without_user)
        )

    def _refuse_erased_key(self, agent: str, key: str, reopen: bool) -> None:
        """A routing key whose session was erased opens a new one only when asked."""
        erased_at = self.erased.erased_key(agent, key)
        if erased_at is None:
            return
        if not reopen:
            raise FailedPrecondition(
                "SESSION_ERASED",
                f"this conversation's session was erased (sequence {erased_at}); set "
                "reopen_erased to start a new session for it",
                {"erased_sequence": str(erased_at)},
            )
        self.erased.forget_key(agent, key)

    def _refuse_erased_id(self, session_id: str, reopen: bool) -> None:
        erased_at = self.erased.erased_id(session_id)
        if erased_at is None:
            return
        if not reopen:
            raise FailedPrecondition(
                "SESSION_ERASED",
                f"session {session_id!r} was erased (sequence {erased_at}); set reopen_erased "
                "to create a new session under this id",
                {"erased_sequence": str(erased_at)},
            )
        self.erased.forget_id(session_id)

    def reset_now(self, now: float, agent: str, session_id: str, reason: str) -> Session:
        """Ends a session with a reason and opens a fresh one on its routing key."""
        index = self.core.open_session_of(agent, session_id)
        old = self.core.summary(session_id, index)
        self.core.log(now, [self._ended_event(index, reason)])
        key, source = self._successor_key(agent, index.routing_key, old.source or Source())
        return self.open_session(now, agent, new_session_id(), key, source)

    def _successor_key(self, agent: str, key: str, source: Source) -> tuple[str, Source]:
        """The key and source a reset's new session gets: its predecessor's, but for a
        redacting agent's session from before thread ids were hashed, whose successor
        is keyed and stored with the thread hashed (as a new conversation in that thread
        is), so that no new session stores the raw thread. A key that is not the one
        its source gives now (another policy, kept by the key migration) is kept."""
        if not routing.holds_raw_thread(source):
            return key, source
        settings = self.agents.live_agent_summary(agent).settings
        redactor = self.core.redactor_for(settings)
        policy = settings.routing if settings else None
        if redactor is None or routing.unbounded_key(agent, source, policy) != key:
            return key, source
        hashed = routing.stored_source(source, redactor)
        new_key = routing.unbounded_key(agent, hashed, policy)
        return (key, source) if len(new_key) > routing.MAX_ROUTING_KEY_LEN else (new_key, hashed)

    async def append(
        self,
        agent: str,
        session_id: str,
        expected_version: int | None,
        inputs: Sequence[EventInput],
        echo: bool = True,
        deltas: Sequence[StateChanged] = (),
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[list[Event], int, list[int]]:
        """(the events as logged, or none without `echo`; the version; their sequences).
        `inputs`: each input's body (None: it had none) and its encoded size. An echo
        that would not fit one answer is refused before anything is written. `deltas`:
        scoped state changes logged after the events, in the same transaction."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        if (not inputs and not deltas) or len(inputs) > MAX_EVENTS_PER_APPEND:
            low = 0 if deltas else 1
            raise InvalidArgument("events", f"give {low} to {MAX_EVENTS_PER_APPEND} events")
        limits = self.core.limits
        deltas = checked_deltas(
            "state_deltas", deltas, limits.max_state_value_bytes, allow_none=True
        )
        bodies = [
            checked_input(i, event.body, self.core.limits.max_content_bytes)
            for i, event in enumerate(inputs)
        ]
        if echo:
            sizes = [event.size + len(agent) + len(session_id) for event in inputs]
            sizes += [convert.encoded_size(delta) + len(agent) for delta in deltas]
            refuse_unanswerable("events", sizes, "set sequences_only, or split the append")

        def op(now: float) -> tuple[list[Event], int, list[int]]:
            index = self.core.open_session_of(agent, session_id)
            if expected_version is not None and expected_version != index.version:
                raise Aborted(
                    "VERSION_MISMATCH",
                    f"session {session_id!r} is at version {index.version}, not "
                    f"{expected_version}: re-read it and retry",
                    {"version": str(index.version)},
                )
            events = [
                Event(
                    agent=agent,
                    session_id=session_id,
                    session_version=index.version + offset + 1,
                    body=body,
                )
                for offset, body in enumerate(bodies)
            ]
            self.core.redact_senders(agent, events)
            self._refuse_state_growth_past_limit(session_id, events)
            # Hook (issue 23): the deltas' StateChanged events, after the events.
            first = index.version + len(events) + 1
            changed = (
                self.scoped.events(agent, index, deltas, first, "state_deltas") if deltas else []
            )
            logged = self.core.log(now, events + changed, index)
            sequences = [event.sequence for event in logged]
            version = index.version + len(events) + sum(1 for e in changed if e.session_id)
            return (logged if echo else []), version, sequences

        result: tuple[list[Event], int, list[int]] = await self.core.write(op, guard=guard)
        return result

    async def post_to_inbox(
        self,
        agent: str,
        session_id: str,
        message: Message,
        mark: ResumeMarked | None = None,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Event, bool]:
        """(the post's event, whether it is a duplicate: see `post`). `mark`: a resume
        mark logged in the same transaction, right before the post (not for a duplicate)."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        checked_message("message", message, self.core.limits.max_content_bytes)
        size = convert.encoded_size(message) + len(agent) + len(session_id)
        refuse_unanswerable("message", [size], "shorten the message")

        result: tuple[Event, bool] = await self.core.write(
            lambda now: self.post(now, agent, session_id, message, mark=mark), guard=guard
        )
        return result

    def post(
        self,
        now: float,
        agent: str,
        session_id: str,
        message: Message,
        redact: bool | None = None,
        mark: ResumeMarked | None = None,
    ) -> tuple[Event, bool]:
        """Puts a message into an open session's inbox (in the caller's transaction):
        (its event, False). A message_ref the session accepted before is a platform's
        message posted again: (the first post's event, True), and nothing is written.
        The caller holds the log's write lock, so of posts racing with one ref (other
        replicas' too) exactly one is accepted. `redact`: whether its sender is hashed
        (None: as the agent's settings say); `mark`: a resume mark logged right before
        the post. The ref is compared as stored: hashed first when the post is redacted."""
        index = self.core.open_session_of(agent, session_id)
        # Unversioned, both: an inbox post and a resume mark never conflict with a turn.
        posted = Event(
            agent=agent,
            session_id=session_id,
            session_version=index.version,
            body=InboxPosted(message=message),
        )
        self.core.redact_senders(agent, [posted], redact)
        assert isinstance(posted.body, InboxPosted) and posted.body.message is not None
        stored_ref = posted.body.message.message_ref
        if stored_ref:
            accepted = self.store.log.accepted_post(session_id, stored_ref)
            if accepted is not None:
                return accepted, True
        self._refuse_state_growth_past_limit(session_id, [posted])
        marked = [] if mark is None else [replace(posted, body=mark)]
        return self.core.log(now, [*marked, posted], index)[-1], False

    def _refuse_state_growth_past_limit(self, session_id: str, events: Sequence[Event]) -> None:
        growth = sum(convert.encoded_size(e) for e in events if isinstance(e.body, _STATE_GROWING))
        if not growth:
            return  # plain history appends never read the state: the hot path stays cheap
        state = self.store.states.session_state(session_id)
        assert state is not None
        if convert.encoded_size(state) + growth > MAX_SESSION_STATE_BYTES:
            raise FailedPrecondition(
                "SESSION_STATE_TOO_LARGE",
                f"session {session_id!r} would hold more than {MAX_SESSION_STATE_BYTES} bytes "
                "of inbox, outbox, task and temp state: drain the inbox (inbox_drained) or "
                "acknowledge the outbox (outbox_acked) first",
            )
