"""The session tables: one peewee model per table, and `Tables`, which binds them to a
backend for the storage parts to share (`event_log`, `snapshots`, `projections`,
`markers`, `history`).

- `session_log`: every event, one global sequence. Sequences come from the
  single `session_log_head` row, updated in the appending transaction: the
  row lock (Postgres) or the database lock (SQLite) serializes appenders, so
  sequences are assigned in commit order and a reader tailing the log never
  sees N+1 before N. Never MAX(seq)+1.
- `session_agent`, `session_session`, `session_route`, `session_lineage`:
  projections of the log kept in the same transactions (what lists, routing and
  version checks read).
- `session_snapshot`: cached states; deleting them all changes nothing.
- `session_rewind`, `session_checkpoint`, `session_retention`,
  `session_version_floor`: the timeline's markers and what truncation keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import peewee

from session_service import storage_format
from switchboard.database import Backend, bind_model

#: The log rows that accept a platform message into a session: inbox posts with a
#: message_ref, on the current timeline. Raw SQL (a boolean column alone), the same
#: text in the unique index and in the lookup, so that SQLite sees the lookup
#: matches the partial index.
ACCEPTED_POSTS = "inbound_ref IS NOT NULL AND active"
INBOUND_REF_INDEX = "session_log_inbound_ref"


class LogHeadRow(peewee.Model):
    id = peewee.IntegerField(primary_key=True)
    seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_log_head"


class EventRow(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128, null=True)
    kind = peewee.CharField(max_length=32)
    payload = peewee.BlobField()  # an event in `format` (see `storage_format`): never pickle
    format = peewee.SmallIntegerField(default=storage_format.CURRENT)
    # Tool-call bookkeeping, so a rewind can find the cycles it would cut:
    # "c:<id>\n<id>…" on a message requesting calls, "r:<id>" on a tool result.
    tool_ref = peewee.TextField(null=True)
    # Part of the current timeline: False once a rewind abandons the row, True again
    # when a checkout restores it. Written by the move itself (see `mark`).
    active = peewee.BooleanField()
    # An inbox post's message_ref (NULL for every other row, and for posts without
    # one): unique per session among active rows, see `EventLog.accepted_post`.
    inbound_ref = peewee.TextField(null=True)

    class Meta:
        table_name = "session_log"
        indexes = (
            (("session_id", "seq"), False),
            (("agent", "session_id", "seq"), False),
            (("session_id", "kind", "seq"), False),
            # States and histories read only active rows, however many are abandoned.
            (("session_id", "active", "seq"), False),
            (("agent", "session_id", "active", "seq"), False),
            (("session_id", "kind", "active", "seq"), False),  # a history page
            peewee.Index(
                INBOUND_REF_INDEX,
                peewee.Table("session_log"),
                [peewee.SQL("session_id"), peewee.SQL("inbound_ref")],
                unique=True,
                where=peewee.SQL(ACCEPTED_POSTS),
            ),
        )


class AgentRow(peewee.Model):
    name = peewee.CharField(max_length=64, primary_key=True)
    archived = peewee.BooleanField()
    version = peewee.BigIntegerField()
    last_seq = peewee.BigIntegerField()
    snapshot_version = peewee.BigIntegerField()
    summary = peewee.BlobField(null=True)  # `AgentIndex.summary`

    class Meta:
        table_name = "session_agent"


class SessionRow(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    routing_key = peewee.TextField()
    transport = peewee.CharField(max_length=32)
    status = peewee.IntegerField()
    created_seq = peewee.BigIntegerField()
    last_seq = peewee.BigIntegerField()
    version = peewee.BigIntegerField()
    snapshot_version = peewee.BigIntegerField()
    resume_pending = peewee.BooleanField(default=False)
    summary = peewee.BlobField(null=True)  # `SessionIndex.summary`

    class Meta:
        table_name = "session_session"
        indexes = (
            (("agent", "created_seq"), False),
            (("created_seq",), False),  # every agent's sessions, newest first
            (("routing_key",), False),
        )


class RouteRow(peewee.Model):
    agent = peewee.CharField(max_length=64)
    routing_key = peewee.CharField(max_length=512)
    session_id = peewee.CharField(max_length=128)

    class Meta:
        table_name = "session_route"
        primary_key = peewee.CompositeKey("agent", "routing_key")


class SnapshotRow(peewee.Model):
    entity = peewee.CharField(max_length=200)  # "agent:<name>" or "session:<id>"
    seq = peewee.BigIntegerField()
    state = peewee.BlobField()  # in `format`, as a log row's payload
    format = peewee.SmallIntegerField(default=storage_format.CURRENT)
    # Taken at an active sequence; False while a rewind has abandoned that sequence.
    active = peewee.BooleanField()

    class Meta:
        table_name = "session_snapshot"
        primary_key = peewee.CompositeKey("entity", "seq")
        indexes = (
            (("entity", "active", "seq"), False),
            (("seq",), False),  # a move marks snapshots by sequence range
        )


class RewindRow(peewee.Model):
    seq = peewee.BigIntegerField(primary_key=True)  # the rewind record's sequence
    target = peewee.BigIntegerField()

    class Meta:
        table_name = "session_rewind"


class CheckpointRow(peewee.Model):
    label = peewee.CharField(max_length=128, primary_key=True)
    seq = peewee.BigIntegerField()
    created_at = peewee.DoubleField()

    class Meta:
        table_name = "session_checkpoint"


class RetentionRow(peewee.Model):
    id = peewee.IntegerField(primary_key=True)
    retained_from = peewee.BigIntegerField()  # the lowest sequence a rewind may target

    class Meta:
        table_name = "session_retention"


class LineageRow(peewee.Model):
    """One ancestor of a fork whose history it shares: the fork's history holds the
    ancestor's messages up to `until_seq` (a fork of a fork has one row per ancestor,
    so a history read is one statement whatever the depth)."""

    session_id = peewee.CharField(max_length=128)
    ancestor_id = peewee.CharField(max_length=128)
    until_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_lineage"
        primary_key = peewee.CompositeKey("session_id", "ancestor_id")


class VersionFloorRow(peewee.Model):
    """The highest version an agent or session had when `TruncateLog` deleted its events
    while no projection row kept its version (a rewind had undone it): what
    `Markers.highest_version` can no longer read from the log."""

    entity = peewee.CharField(max_length=200, primary_key=True)  # as a snapshot's
    version = peewee.BigIntegerField()

    class Meta:
        table_name = "session_version_floor"


class KeyReportRow(peewee.Model):
    """A session the upgrade to injective routing keys reported (`key_migration`)."""

    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    status = peewee.CharField(max_length=16)  # "open" or "ended", at the upgrade
    old_key = peewee.TextField()
    new_key = peewee.TextField()
    finding = peewee.CharField(max_length=32)  # one of `key_migration.FINDINGS`
    evidence = peewee.TextField()

    class Meta:
        table_name = "session_key_report"


class Tables:
    """The session tables bound to one backend (two servers in one process never share
    a binding), and its SQL dialect for the statements written by hand."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.database: Any = backend.database
        self.Head = bind_model(LogHeadRow, self.database)
        self.Event = bind_model(EventRow, self.database)
        self.Agent = bind_model(AgentRow, self.database)
        self.Session = bind_model(SessionRow, self.database)
        self.Route = bind_model(RouteRow, self.database)
        self.Snapshot = bind_model(SnapshotRow, self.database)
        self.Rewind = bind_model(RewindRow, self.database)
        self.Checkpoint = bind_model(CheckpointRow, self.database)
        self.Retention = bind_model(RetentionRow, self.database)
        self.Lineage = bind_model(LineageRow, self.database)
        self.VersionFloor = bind_model(VersionFloorRow, self.database)
        self.KeyReport = bind_model(KeyReportRow, self.database)
        self.models = (
            self.Head, self.Event, self.Agent, self.Session, self.Route, self.Snapshot,
            self.Rewind, self.Checkpoint, self.Retention, self.Lineage, self.VersionFloor,
            self.KeyReport,
        )  # fmt: skip
        #: `?` placeholders in the backend's dialect (`Backend.sql`).
        self.sql = backend.sql


class Part:
    """What every storage part shares: the bound tables and the statement helpers."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.backend = tables.backend
        self.database: Any = tables.database
        self.Head = tables.Head
        self.Event = tables.Event
        self.Agent = tables.Agent
        self.Session = tables.Session
        self.Route = tables.Route
        self.Snapshot = tables.Snapshot
        self.Rewind = tables.Rewind
        self.Checkpoint = tables.Checkpoint
        self.Retention = tables.Retention
        self.Lineage = tables.Lineage
        self.VersionFloor = tables.VersionFloor
        self.KeyReport = tables.KeyReport

    def _sql(self, text: str) -> str:
        return self.backend.sql(text)

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A log INSERT or projection upsert: nothing reads its answer, so the backend
        may send it with the transaction's next statement (`Backend.execute_later`)."""
        self.backend.execute_later(sql, params)

    def _active(self) -> peewee.Expression:
        return self.Event.active == True  # noqa: E712 - SQL, not Python
