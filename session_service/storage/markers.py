"""The timeline's markers and what truncation keeps: rewind records, the rows'
`active` markers a move sets, tool-call bookkeeping a rewind consults, checkpoints,
the retained start of the log and the version floors of truncated entities."""

from __future__ import annotations

import peewee

from session_service import storage_format
from session_service.storage import queries
from session_service.storage.event_log import (
    EventLog,
    agent_entity,
    entity_filter,
    session_entity,
)
from session_service.storage.kinds import LOG_RECORD_KINDS
from session_service.storage.projections import Projections
from session_service.storage.schema import Part, Tables
from session_service.timeline import Timeline
from switchboard.database import tuples


class Markers(Part):
    def __init__(self, tables: Tables, log: EventLog, projections: Projections) -> None:
        super().__init__(tables)
        self.log = log
        self.projections = projections

    def rewind_records(self) -> list[tuple[int, int]]:
        """Every (rewind record, target): what a checkout computes the timeline from
        (reads filter on the rows' `active` markers instead)."""
        records = tuples(self.Rewind.select(self.Rewind.seq, self.Rewind.target))
        return [(int(seq), int(target)) for seq, target in records]

    def timeline(self) -> Timeline:
        """The abandoned intervals, computed afresh (nothing shared between threads)."""
        return Timeline.from_records(self.rewind_records())

    def add_rewind(self, seq: int, target: int) -> None:
        self.Rewind.insert(seq=seq, target=target).execute()

    def move_effect(self, first: int, last: int, active: bool) -> list[tuple[str, str, int]]:
        """(agent, session id or "", events) for the log rows in [first, last] whose
        marker is `active` now, rewind records left out; a move's bookkeeping
        (RewindApplied) is listed with 0 events, so its entity is refreshed too."""
        rows = self.database.execute_sql(
            self._sql(queries.MOVE_EFFECT),
            [first, last, active],
        ).fetchall()
        return [
            (str(agent), str(session_id or ""), int(count)) for agent, session_id, count in rows
        ]

    def mark(self, first: int, last: int, active: bool) -> None:
        """Sets the marker of the log rows and snapshots in [first, last]; guarded, so
        only rows whose status changes are written. Audit records keep theirs."""
        for statement in (queries.MARK_LOG, queries.MARK_SNAPSHOTS):
            self.database.execute_sql(self._sql(statement), [active, first, last, not active])

    def tool_results_after(self, seq: int) -> dict[str, set[str]]:
        """Per session, the tool calls answered by active events after `seq`."""
        query = self.Event.select(self.Event.session_id, self.Event.tool_ref).where(
            (self.Event.seq > seq) & self.Event.tool_ref.startswith("r:") & self._active()
        )
        answered: dict[str, set[str]] = {}
        for session_id, ref in tuples(query):
            answered.setdefault(session_id, set()).add(ref[2:])
        return answered

    def earliest_request(
        self, session_id: str, call_ids: set[str], at_or_before: int
    ) -> int | None:
        """The earliest active message at or before a sequence requesting one of the calls."""
        query = self.Event.select(self.Event.seq, self.Event.tool_ref).where(
            (self.Event.session_id == session_id)
            & (self.Event.seq <= at_or_before)
            & self.Event.tool_ref.startswith("c:")
            & self._active()
        )
        starts = [int(seq) for seq, ref in tuples(query) if call_ids & set(ref[2:].split("\n"))]
        return min(starts, default=None)

    def add_checkpoint(self, label: str, seq: int, now: float) -> bool:
        inserted = (
            self.Checkpoint.insert(label=label, seq=seq, created_at=now)
            .on_conflict_ignore()
            .as_rowcount()
            .execute()
        )
        return bool(inserted)

    def checkpoint(self, label: str) -> tuple[str, int, float] | None:
        rows = tuples(self.Checkpoint.select().where(self.Checkpoint.label == label))
        return (str(rows[0][0]), int(rows[0][1]), float(rows[0][2])) if rows else None

    def checkpoints_page(
        self, after: tuple[int, str] | None, limit: int, min_seq: int = 0
    ) -> list[tuple[str, int, float]]:
        """Checkpoints at `min_seq` or later after (sequence, label), in that order."""
        query = self.Checkpoint.select()
        if min_seq:
            query = query.where(self.Checkpoint.seq >= min_seq)
        if after is not None:
            seq, label = after
            query = query.where(
                (self.Checkpoint.seq > seq)
                | ((self.Checkpoint.seq == seq) & (self.Checkpoint.label > label))
            )
        rows = tuples(query.order_by(self.Checkpoint.seq, self.Checkpoint.label).limit(limit))
        return [(str(label), int(seq), float(at)) for label, seq, at in rows]

    def retained_from(self) -> int:
        return int(self.Retention.get_by_id(1).retained_from)

    def entities_needing_events_below(self, seq: int) -> list[str]:
        """Entities whose state at `seq` or later would need a log event below `seq`.

        Each entity with events below `seq` needs an active snapshot taken at or
        after its last such event and no later than `seq`; and no abandoned branch
        may cross `seq` (a checkout onto it would need its deleted start).
        """
        if not self.log.is_active(seq):
            return ["an abandoned branch crossing that sequence"]
        last_below = tuples(
            self.Event.select(
                self.Event.agent, self.Event.session_id, peewee.fn.MAX(self.Event.seq)
            )
            .where(
                (self.Event.seq < seq) & self.Event.kind.not_in(LOG_RECORD_KINDS) & self._active()
            )
            .group_by(self.Event.agent, self.Event.session_id)
        )
        blocking = []
        for agent, session_id, last in last_below:
            entity = session_entity(session_id) if session_id else agent_entity(agent)
            covered = (
                self.Snapshot.select()
                .where(
                    (self.Snapshot.entity == entity)
                    & (self.Snapshot.seq >= last)
                    & (self.Snapshot.seq <= seq)
                    & (self.Snapshot.active == True)  # noqa: E712 - SQL, not Python
                )
                .exists()
            )
            if not covered:
                blocking.append(entity)
        return blocking

    def truncate_below(self, seq: int) -> int:
        self._keep_versions_of_undone_below(seq)
        deleted = (
            self.Event.delete()
            .where((self.Event.seq < seq) & self.Event.kind.not_in(LOG_RECORD_KINDS))
            .execute()
        )
        self.Retention.update(retained_from=seq).where(self.Retention.id == 1).execute()
        return int(deleted)

    def _keep_versions_of_undone_below(self, seq: int) -> None:
        """Records the highest version of each agent and session whose events below `seq`
        are about to be deleted and whose version no projection row keeps (a rewind undid
        it): created again, it must start above them (`highest_version`)."""
        undone = self.database.execute_sql(
            self._sql(queries.UNDONE_BELOW),
            [seq],
        ).fetchall()
        for agent, session_id in undone:
            entity = session_entity(session_id) if session_id else agent_entity(agent)
            version = self.highest_version(entity)  # the floor's old value included
            self.VersionFloor.insert(entity=entity, version=version).on_conflict(
                conflict_target=[self.VersionFloor.entity],
                update={self.VersionFloor.version: version},
            ).execute()

    def highest_version(self, entity: str) -> int:
        """The highest version the agent or session ever had, on any branch, truncated
        ones included: 0 for one never logged. New versions start above it, so that
        none ever repeats."""
        kind, where, key = entity_filter(entity)
        index = (
            self.projections.agent_index(key)
            if kind == "agent"
            else self.projections.session_index(key)
        )
        projected = 0 if index is None else index.version
        # The version floor a truncation left, beside the newest event: one statement.
        row = self.database.execute_sql(
            self._sql(queries.floor_and_newest(where)),
            [entity, key],
        ).fetchone()
        known = max(projected, int(row[0] or 0))
        if row[1] is None:
            return known
        # Every new version is above all earlier ones: the newest event has the highest.
        newest = storage_format.decode_event(int(row[1]), row[2])
        if kind == "session":
            return max(known, newest.session_version)
        if newest.agent_version:
            return max(known, newest.agent_version)
        # Logged before agent versions were recorded, when each event counted one.
        count = self.database.execute_sql(self._sql(queries.count_events(where)), [key]).fetchone()[
            0
        ]
        return max(known, int(count))
