"""The session core's shared parts: the log every change goes through, the
watchers it wakes, the session rows every part reads, and personal ids.

Every change is a typed event appended to the global log by `Core.log`, which
also keeps the projections (agent and session index rows, routes) in the same
transaction through `Projection.project`, the one function a rebuild replays too.
A read whose answer takes more than one statement runs them in one read snapshot
(`TransactionRunner.read(..., consistent=True)`): a rewind committed between two of
them would otherwise pair parts of two states (a version with another branch's memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from session_service import pii, storage_format
from session_service.projection import Projection
from session_service.records import (
    CARRYING_MESSAGES,
    AgentSettings,
    Event,
    Session,
    SessionStatus,
)
from session_service.storage.projections import SessionIndex
from session_service.storage.store import SessionStore
from session_service.watching import Watching, WatchLimits
from switchboard.errors import FailedPrecondition, NotFound
from switchboard.idempotency import DEFAULT_WINDOW_S, RequestGuard
from switchboard.runner import TransactionRunner


@dataclass(frozen=True)
class SessionLimits:
    #: A snapshot is written when an entity has this many events since its last one.
    snapshot_every: int = 100
    #: Longest message content accepted, in UTF-8 bytes (--max-content-bytes).
    max_content_bytes: int = 256 * 1024
    #: Largest scoped state value, in UTF-8 bytes (--max-state-value-bytes).
    max_state_value_bytes: int = 256 * 1024
    #: Largest stored record payload (--max-record-bytes), and a PutRecords call's
    #: payloads together (--max-records-call-bytes): the call is one log row.
    max_record_bytes: int = 1024 * 1024
    max_records_call_bytes: int = 8 * 1024 * 1024
    #: How often the log tailer looks for events no notification announced (other
    #: replicas on SQLite, or Postgres while LISTEN is down).
    watch_poll_s: float = 1.0
    #: WatchEvents streams held at once (--max-watchers), and each live watcher's queue
    #: bound: beyond it the watcher is ended WATCHER_TOO_SLOW (see `watching`).
    max_watchers: int = 4000
    watch_queue_events: int = 1000
    watch_queue_bytes: int = 4 * 1024 * 1024
    #: How long a request id's answer is kept for retries.
    request_id_window_s: float = DEFAULT_WINDOW_S


def _raw_senders(events: Sequence[Event]) -> list[Event]:
    """The events carrying a message whose sender is a person's raw id, or whose
    message ref is raw (a platform's message id names its chat)."""
    return [
        event
        for event in events
        if isinstance(event.body, CARRYING_MESSAGES)
        and event.body.message is not None
        and (
            pii.sender_is_raw(event.body.message.sender)
            or pii.ref_is_raw(event.body.message.message_ref)
        )
    ]


class Core:
    def __init__(
        self,
        runner: TransactionRunner,
        store: SessionStore,
        limits: SessionLimits,
        redactor: pii.Redactor | None = None,
    ) -> None:
        self.runner = runner
        self.store = store
        self.limits = limits
        #: Hashes the ids agents with `settings.redact_pii` must not store raw.
        self.redactor = redactor or pii.Redactor()
        self.projection = Projection(store, limits.snapshot_every)
        watch_limits = WatchLimits(
            max_watchers=limits.max_watchers,
            queue_events=limits.watch_queue_events,
            queue_bytes=limits.watch_queue_bytes,
            poll_s=limits.watch_poll_s,
        )
        self.watching = Watching(runner, store, watch_limits, self._watchable)

    def log(
        self, now: float, events: Sequence[Event], session: SessionIndex | None = None
    ) -> list[Event]:
        """Appends events and keeps the projections and snapshots with them. `session`:
        the projection row of the events' session as the caller read it in this
        transaction (under the log lock), so that it is not read again."""
        self.projection.number_agent_events(events)
        logged = self.store.log.append(events, now)
        self.projection.project(logged, snapshot=True, known=session)
        return logged

    def record(self, now: float, events: Sequence[Event]) -> list[Event]:
        """Appends events that no projection folds as they are logged: the log's own
        records (a rewind, an operator action, an erasure), and the RewindApplied a
        move logs while it refreshes the projections itself (`time_travel`). With
        `log`, the only way into the log."""
        return self.store.log.append(events, now)

    def notify_watchers(self) -> None:
        self.watching.notify()

    async def write(self, op: Callable[[float], Any], guard: RequestGuard | None = None) -> Any:
        """Runs `op(now)` in a write transaction and wakes the watchers after its
        commit: every write of the session rules comes through here. `guard`: the
        call's request id, for the call's first write (`TransactionRunner.write`)."""
        result = await self.runner.write(op, guard)
        self.notify_watchers()
        return result

    def session_of(self, agent: str, session_id: str) -> SessionIndex:
        """The agent's session; another agent's session is NOT_FOUND too (routing is scoped)."""
        index = self.store.projections.session_index(session_id)
        if index is None or index.agent != agent:
            raise NotFound("SESSION_NOT_FOUND", f"agent {agent!r} has no session {session_id!r}")
        return index

    def open_session_of(self, agent: str, session_id: str) -> SessionIndex:
        index = self.session_of(agent, session_id)
        if index.status != SessionStatus.OPEN:
            raise FailedPrecondition(
                "SESSION_ENDED", f"session {session_id!r} has ended; resolve or spawn a new one"
            )
        return index

    def summary(self, session_id: str, index: SessionIndex | None = None) -> Session:
        """The session as its projection row keeps it: one statement, none when the
        caller passes the row it read in this transaction."""
        index = index or self.store.projections.session_index(session_id)
        assert index is not None, f"no session {session_id!r}"
        if index.summary is None:  # a row not summarized yet (see `recovery.fill_summaries`)
            state = self.store.states.session_state(session_id)
            assert state is not None and state.session is not None
            return state.session
        return storage_format.decode_session_summary(index.summary)

    def redactor_for(self, settings: AgentSettings | None) -> pii.Redactor | None:
        """The redactor when the agent redacts PII, else None (ids stored as given)."""
        return self.redactor if settings is not None and settings.redact_pii else None

    def redacts_pii(self, agent: str) -> bool:
        """The agent's setting, read from its state: 2 statements (the latest
        snapshot, the events after it)."""
        state = self.store.states.agent_state(agent)
        return state is not None and state.settings is not None and state.settings.redact_pii

    def redact_senders(
        self, agent: str, events: Sequence[Event], redact: bool | None = None
    ) -> None:
        """Hashes the senders and message refs of the events' messages when `redact`
        (None: when the agent's settings say so). The agent is read only if some sender
        or ref is raw: appends without them, with agents as senders, or with senders
        stored redacted before (a turn's inbox moved into its history) cost nothing."""
        raw = _raw_senders(events)
        if not raw:
            return
        if redact is None:
            redact = self.redacts_pii(agent)
        if not redact:
            return
        for event in raw:
            # New values, never edits: the bodies may be the caller's input, which a
            # retried transaction must find as it was.
            body = event.body
            assert isinstance(body, CARRYING_MESSAGES) and body.message is not None
            message = replace(
                body.message,
                sender=self.redactor.sender(body.message.sender),
                message_ref=self.redactor.message_ref(body.message.message_ref),
            )
            event.body = replace(body, message=message)

    def _watchable(self, agent: str, session_id: str) -> None:
        if agent:
            self.session_of(agent, session_id)
        elif self.store.projections.session_index(session_id) is None:
            raise NotFound("SESSION_NOT_FOUND", f"there is no session {session_id!r}")
