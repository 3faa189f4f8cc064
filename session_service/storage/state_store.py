"""Scoped state's storage: a key-value read model of the StateChanged events.

- `session_state_value`: (owner, key) -> value, what reads answer; kept in the
  transaction that logs the change (`FrameworkProjection.project`).
- `session_state_event`: which owner each StateChanged log row belongs to, active
  or not, so that a rewind or checkout finds the owners whose events it moved and
  refolds them from their own events only.
- `session_state_base`: an owner's entries as of the lowest retained sequence, kept
  when TruncateLog deletes the events they were folded from (a refold starts there).

An owner is `session:<id>`, `user:<agent>:<user id>` or `agent:<name>` (agent names
hold no ':', so the first ':' after the agent ends it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee

from session_service import storage_format
from session_service.records import StateChanged, StateScope
from session_service.storage import queries
from switchboard.database import Backend, bind_model


class StateValueRow(peewee.Model):
    owner = peewee.CharField(max_length=400)
    key = peewee.CharField(max_length=256)
    value = peewee.TextField()
    seq = peewee.BigIntegerField()  # the StateChanged event that set it

    class Meta:
        table_name = "session_state_value"
        primary_key = peewee.CompositeKey("owner", "key")


class StateEventRow(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    owner = peewee.CharField(max_length=400)

    class Meta:
        table_name = "session_state_event"
        indexes = ((("owner", "seq"), False),)


class StateBaseRow(peewee.Model):
    owner = peewee.CharField(max_length=400)
    key = peewee.CharField(max_length=256)
    value = peewee.TextField()

    class Meta:
        table_name = "session_state_base"
        primary_key = peewee.CompositeKey("owner", "key")


def session_owner(session_id: str) -> str:
    return f"session:{session_id}"


def user_owner(agent: str, user_id: str) -> str:
    return f"user:{agent}:{user_id}"


def agent_owner(agent: str) -> str:
    return f"agent:{agent}"


def owner_of(agent: str, session_id: str, change: StateChanged) -> str:
    """The owner a logged StateChanged event belongs to."""
    if change.scope == StateScope.SESSION:
        return session_owner(session_id)
    if change.scope == StateScope.USER:
        return user_owner(agent, change.user_id)
    return agent_owner(agent)


def folded(entries: dict[str, str], change: StateChanged) -> dict[str, str]:
    """`entries` with one change applied (the one definition of a StateChanged)."""
    entries.update(change.set)
    for key in change.removed:
        entries.pop(key, None)
    return entries


class StateStore:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.Value = bind_model(StateValueRow, self.database)
        self.EventIndex = bind_model(StateEventRow, self.database)
        self.Base = bind_model(StateBaseRow, self.database)
        self.models = (self.Value, self.EventIndex, self.Base)
        self._upsert_value = self._sql(queries.UPSERT_STATE_VALUE)
        self._delete_value = self._sql(queries.DELETE_STATE_VALUE)
        self._index_event = self._sql(queries.INDEX_STATE_EVENT)
        self._owner_events = self._sql(queries.OWNER_EVENTS)

    # -- the read model ----------------------------------------------------------------------

    def values(self, owners: Sequence[str]) -> dict[str, dict[str, str]]:
        """Each owner's entries (one statement)."""
        found: dict[str, dict[str, str]] = {owner: {} for owner in owners}
        if not owners:
            return found
        rows = self.database.execute_sql(
            self._sql(queries.state_values(len(owners))),
            list(owners),
        ).fetchall()
        for owner, key, value in rows:
            found[str(owner)][str(key)] = str(value)
        return found

    def size(self, owner: str) -> int:
        """The bytes an owner's entries take (keys and values, as stored)."""
        row = self.database.execute_sql(
            self._sql(queries.STATE_SIZE),
            [owner],
        ).fetchone()
        return int(row[0])

    def apply(self, owner: str, seq: int, change: StateChanged) -> None:
        """Folds a logged change into the read model and indexes its event."""
        self.database.execute_sql(self._index_event, [seq, owner])
        for key, value in change.set.items():
            self.database.execute_sql(self._upsert_value, [owner, key, value, seq])
        for key in change.removed:
            self.database.execute_sql(self._delete_value, [owner, key])

    # -- time travel ------------------------------------------------------------------------

    def owners_between(self, first: int, last: int) -> set[str]:
        """The owners of StateChanged rows in [first, last] (active or not)."""
        rows = self.database.execute_sql(
            self._sql(queries.STATE_OWNERS_BETWEEN),
            [first, last],
        ).fetchall()
        return {str(owner) for (owner,) in rows}

    def fold(self, owner: str, until: int | None = None) -> dict[str, str]:
        """An owner's entries from its base and its active events (up to `until`)."""
        entries = {
            str(key): str(value)
            for key, value in self.database.execute_sql(
                self._sql(queries.STATE_BASE), [owner]
            ).fetchall()
        }
        bound = until if until is not None else 2**62
        for fmt, payload in self.database.execute_sql(
            self._owner_events, [owner, True, bound]
        ).fetchall():
            body = storage_format.decode_event(int(fmt), payload).body
            assert isinstance(body, StateChanged)
            folded(entries, body)
        return entries

    def rewrite(self, owner: str, entries: dict[str, str], seq: int) -> None:
        """Rewrites an owner's read model (after a move refolded it)."""
        self.database.execute_sql(self._sql(queries.DELETE_STATE_VALUES_OF), [owner])
        for key, value in entries.items():
            self.database.execute_sql(self._upsert_value, [owner, key, value, seq])

    def keep_base_below(self, below: int) -> None:
        """Before TruncateLog deletes the rows below `below`: each owner with events
        there gets its fold up to them as its base, and their index rows go."""
        rows = self.database.execute_sql(self._sql(queries.STATE_OWNERS_BELOW), [below]).fetchall()
        for (owner,) in rows:
            entries = self.fold(str(owner), until=below - 1)
            self.database.execute_sql(self._sql(queries.DELETE_STATE_BASE_OF), [owner])
            for key, value in entries.items():
                self.database.execute_sql(
                    self._sql(queries.INSERT_STATE_BASE),
                    [owner, key, value],
                )
        self.database.execute_sql(self._sql(queries.DELETE_STATE_EVENTS_BELOW), [below])

    # -- erasure and rebuild ----------------------------------------------------------------

    def forget(self, owner: str) -> None:
        """Everything kept of an erased owner (its events' rows are tombstones now)."""
        for statement in queries.FORGET_STATE_OWNER:
            self.database.execute_sql(self._sql(statement), [owner])

    def reset_to_bases(self) -> None:
        """A rebuild's start: the read model as the bases alone (events then replay)."""
        self.database.execute_sql(queries.DELETE_STATE_VALUES)
        self.database.execute_sql(queries.STATE_VALUES_FROM_BASES)

    def rows(self) -> set[tuple[Any, ...]]:
        """The read model as a set, for comparing before and after a rebuild (the
        sequence that set a value is bookkeeping, left out)."""
        return {
            (str(owner), str(key), str(value))
            for owner, key, value in self.database.execute_sql(queries.STATE_VALUE_ROWS).fetchall()
        }
