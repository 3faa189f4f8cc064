"""The read models of what agent frameworks store: scoped state, stored records,
retractions, and sessions by user. Kept like the core's projections, in the
transaction that logs their events, and moved with the log:

- `project`: called by `Projection.project` for every logged event (each write,
  and `switchboard session rebuild`, which replays the active log);
- `moved`: called by a rewind or checkout after it marked the log, with the ranges
  it abandoned and restored: index rows of abandoned events go, restored events
  are indexed again (read back from those ranges only), and the owners of scoped
  state whose StateChanged events moved are refolded;
- `truncating`: called before TruncateLog deletes the rows below a sequence;
- `clear` and `rows`: a rebuild's start and its before/after comparison.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from session_service import storage_format
from session_service.records import (
    Event,
    MessagesRetracted,
    RecordsPut,
    SessionOpened,
    SessionState,
    StateChanged,
)
from session_service.storage.records_store import RecordsStore
from session_service.storage.retraction_store import RetractionStore
from session_service.storage.session_user_store import SessionUserStore
from session_service.storage.state_store import StateStore, owner_of
from session_service.timeline import Changes
from switchboard.database import Backend

#: The log kinds this read model indexes (what a restored range is read back for).
INDEXED_KINDS = ("records_put", "messages_retracted", "state_changed")


class FrameworkProjection:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self.state = StateStore(backend)
        self.records = RecordsStore(backend)
        self.retractions = RetractionStore(backend)
        self.users = SessionUserStore(backend)
        self._q = self.database.param

    @property
    def models(self) -> tuple[Any, ...]:
        return (
            *self.state.models,
            *self.records.models,
            *self.retractions.models,
            *self.users.models,
        )

    def project(self, events: Iterable[Event]) -> None:
        for event in events:
            body = event.body
            if isinstance(body, StateChanged):
                owner = owner_of(event.agent, event.session_id, body)
                self.state.apply(owner, event.sequence, body)
            elif isinstance(body, RecordsPut):
                self.records.index(event.sequence, event.agent, event.session_id, body)
            elif isinstance(body, MessagesRetracted):
                self.retractions.index(event.session_id, event.sequence, body.sequences)
            elif isinstance(body, SessionOpened) and body.source and body.source.user_id:
                self.users.put(event.session_id, event.agent, body.source.user_id)

    def moved(self, planned: Changes, sessions: dict[str, SessionState | None]) -> None:
        """After a move marked the log: `sessions`, the states of the sessions it
        changed (None: undone)."""
        owners: set[str] = set()
        for first, last in (*planned.abandoned, *planned.restored):
            owners |= self.state.owners_between(first, last)
        for first, last in planned.abandoned:
            self.records.drop_between(first, last)
            self.retractions.drop_between(first, last)
        for first, last in planned.restored:
            self.project(self._indexed_events_between(first, last))
        for owner in sorted(owners):
            self.state.rewrite(owner, self.state.fold(owner), 0)
        for session_id, state in sessions.items():
            source = state.session.source if state is not None and state.session else None
            if source is not None and source.user_id:
                self.users.put(session_id, state.session.agent, source.user_id)  # type: ignore[union-attr]
            else:
                self.users.drop(session_id)

    def _indexed_events_between(self, first: int, last: int) -> list[Event]:
        kinds = ", ".join(f"'{kind}'" for kind in INDEXED_KINDS)
        rows = self.database.execute_sql(
            f"SELECT format, payload FROM session_log WHERE seq >= {self._q} AND seq <= {self._q} "
            f"AND active = {self._q} AND kind IN ({kinds}) ORDER BY seq",
            [first, last, True],
        ).fetchall()
        # StateChanged events are refolded per owner instead (their order within an
        # owner matters, and the fold starts from the owner's base).
        return [
            event
            for event in (storage_format.decode_event(int(f), p) for f, p in rows)
            if not isinstance(event.body, StateChanged)
        ]

    def truncating(self, below: int) -> list[str]:
        """Before TruncateLog deletes the rows below `below`: keeps the scoped state
        they hold (as bases); answers the sessions whose current records still live
        in those rows (a refusal: their payloads would go)."""
        rows = self.database.execute_sql(
            f"SELECT DISTINCT session_id FROM session_record WHERE seq < {self._q}", [below]
        ).fetchall()
        return [f"records of session:{session_id}" for (session_id,) in rows]

    def keep_state_below(self, below: int) -> None:
        self.state.keep_base_below(below)

    def clear(self) -> None:
        """A rebuild's start (the event index of scoped state and its bases stay: they
        cover abandoned and truncated events, which a rebuild does not replay)."""
        self.state.reset_to_bases()
        self.records.clear()
        self.retractions.clear()
        self.users.clear()

    def rows(self) -> dict[str, set[tuple[Any, ...]]]:
        return {
            "scoped_state": self.state.rows(),
            "records": self.records.rows(),
            "retractions": self.retractions.rows(),
            "session_users": self.users.rows(),
        }

    def forget_session(self, session_id: str, owner: str) -> None:
        """Everything kept of an erased session."""
        self.state.forget(owner)
        self.records.drop_session(session_id)
        self.retractions.drop_session(session_id)
        self.users.drop(session_id)
