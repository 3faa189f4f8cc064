"""Snapshots: cached states of agents and sessions, each at the sequence of the last
event folded into it. Deleting them all changes nothing but the cost of a fold."""

from __future__ import annotations

from typing import TypeVar

from session_service import storage_format
from session_service.records import Agent, SessionState
from session_service.storage import queries
from session_service.storage.schema import Part

S = TypeVar("S", Agent, SessionState)


class Snapshots(Part):
    def latest_snapshot(
        self, entity: str, kind: type[S], until: int | None = None
    ) -> tuple[int, S] | None:
        """The newest snapshot whose sequence is active (one taken at a sequence a
        rewind later abandoned describes a state that no longer exists), and its seq."""
        sql = self._sql(queries.latest_snapshot(bounded=until is not None))
        row = self.database.execute_sql(
            sql, [entity, True, *([] if until is None else [until])]
        ).fetchone()
        if row is None:
            return None
        return int(row[0]), storage_format.decode_state(kind, int(row[1]), row[2])

    def save_snapshot(self, entity: str, seq: int, state: SessionState | Agent) -> None:
        """`seq` is the last event folded into `state`, and states fold only active
        events; snapshots are written under the log's write lock, which every move
        takes too, so the sequence is still active here."""
        self.Snapshot.insert(
            entity=entity,
            seq=seq,
            state=storage_format.encode_state(state),
            format=storage_format.CURRENT,
            active=True,
        ).on_conflict_ignore().execute()

    def delete_snapshots(self) -> int:
        return int(self.Snapshot.delete().execute())
