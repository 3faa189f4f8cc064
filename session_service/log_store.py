"""Session storage: the global event log, its projections and snapshots.

- `session_log`: every event, one global sequence. Sequences come from the
  single `session_log_head` row, updated in the appending transaction: the
  row lock (Postgres) or the database lock (SQLite) serializes appenders, so
  sequences are assigned in commit order and a reader tailing the log never
  sees N+1 before N. Never MAX(seq)+1.
- `session_agent`, `session_session`, `session_route`: projections of the log
  kept in the same transactions (what lists, routing and version checks read).
- `session_snapshot`: cached states; deleting them all changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import peewee

from session_service import convert, replay, storage_format
from session_service.records import (
    Agent,
    Event,
    InboxPosted,
    LogBranch,
    MessageAppended,
    Role,
    Session,
    SessionState,
    SessionStatus,
)
from session_service.retraction_store import NOT_RETRACTED
from session_service.timeline import Timeline
from switchboard import pagination
from switchboard.database import Backend, bind_model, dicts, tuples

S = TypeVar("S", Agent, SessionState)

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
    # one): unique per session among active rows, see `LogStore.accepted_post`.
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
    `LogStore.highest_version` can no longer read from the log."""

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


@dataclass(frozen=True)
class SessionIndex:
    """A session's projection row: what routing, lists and version checks read."""

    session_id: str
    agent: str
    routing_key: str
    transport: str
    status: int
    created_seq: int
    last_seq: int
    version: int
    snapshot_version: int
    resume_pending: bool = False
    #: The session's `Session` as the fold of its events leaves it (serialized,
    #: deterministic), so that lists, GetSession and routing read one row instead of
    #: rebuilding the state. None: not projected yet (a row from before migration 4,
    #: or one written without it); `put_session_index` then folds it.
    summary: bytes | None = None


@dataclass(frozen=True)
class AgentIndex:
    """An agent's projection row."""

    name: str
    archived: bool
    version: int
    last_seq: int
    snapshot_version: int
    #: The agent's `Agent` without its memory as the fold leaves it (serialized,
    #: deterministic): what routing and lists need. None as for `SessionIndex.summary`.
    summary: bytes | None = None


_SESSION_COLUMNS = tuple(SessionIndex.__dataclass_fields__)
_AGENT_COLUMNS = tuple(AgentIndex.__dataclass_fields__)


def serialized_summary(summary: Session | Agent) -> bytes:
    """A projection row's summary: deterministic, so that a rebuild writes the same bytes."""
    return storage_format.encode_summary(summary)


def agent_summary(agent: Agent) -> Agent:
    """The agent as its projection row keeps it: everything but its memory."""
    return replace(agent, memory={})


def _agent_index(row: Sequence[Any]) -> AgentIndex:
    fields = dict(zip(_AGENT_COLUMNS, row, strict=True))
    summary = fields["summary"]
    return AgentIndex(
        **{
            **fields,
            "archived": bool(fields["archived"]),
            "summary": None if summary is None else bytes(summary),
        }
    )


def _session_index(fields: dict[str, Any]) -> SessionIndex:
    summary = fields["summary"]
    return SessionIndex(
        **{
            **fields,
            "resume_pending": bool(fields["resume_pending"]),
            "summary": None if summary is None else bytes(summary),
        }
    )


#: The channel appends are announced on (Postgres NOTIFY), for other replicas' watchers.
LOG_CHANNEL = "switchboard_session_log"

#: The kinds of the log's own records, which belong to no agent or session: no state
#: folds them and no truncation deletes them. Hook (issue 23): an erasure's record,
#: and the tombstones of an erased session's rows ("erased"), which keep their agent
#: and session id but must never fold into a state, be replayed or be moved.
LOG_RECORD_KINDS = ("rewound", "operator_action", "erasure", "erased")
_LOG_RECORD_KINDS_SQL = ", ".join(f"'{kind}'" for kind in LOG_RECORD_KINDS)
#: Audit records stay active whatever a move abandons or restores: what an operator
#: did happened, on whichever branch the log is now (an erasure too).
_NEVER_ABANDONED_SQL = "'operator_action', 'erasure'"


def agent_entity(name: str) -> str:
    return f"agent:{name}"


def session_entity(session_id: str) -> str:
    return f"session:{session_id}"


class LogStore:
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
        self._q = self.database.param
        self._select_session, self._upsert_session = self._row_sql(
            "session_session", _SESSION_COLUMNS
        )
        self._select_agent, self._upsert_agent = self._row_sql("session_agent", _AGENT_COLUMNS)
        self._select_routed_session = self._sql(
            f"SELECT {', '.join(f's.{c}' for c in _SESSION_COLUMNS)} FROM session_route r "
            "JOIN session_session s ON s.session_id = r.session_id "
            "WHERE r.agent = ? AND r.routing_key = ?"
        )
        # A fork's ancestors are its parent's and the parent itself, each up to the
        # earlier of the two fork points (the parent's own are earlier already).
        self._insert_lineage = self._sql(
            "INSERT INTO session_lineage (session_id, ancestor_id, until_seq) "
            "SELECT ?, ancestor_id, until_seq FROM session_lineage WHERE session_id = ? "
            "UNION ALL SELECT ?, ?, ? ON CONFLICT DO NOTHING"
        )
        self._insert_events = self._sql(
            "INSERT INTO session_log "
            "(seq, agent, session_id, kind, format, payload, tool_ref, active, inbound_ref) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        self._select_accepted_post = self._sql(
            "SELECT format, payload FROM session_log WHERE session_id = ? AND inbound_ref = ? "
            f"AND {ACCEPTED_POSTS}"
        )

    # -- the timeline -----------------------------------------------------------------------

    def rewind_records(self) -> list[tuple[int, int]]:
        """Every (rewind record, target): what a checkout computes the timeline from
        (reads filter on the rows' `active` markers instead)."""
        records = tuples(self.Rewind.select(self.Rewind.seq, self.Rewind.target))
        return [(int(seq), int(target)) for seq, target in records]

    def timeline(self) -> Timeline:
        """The abandoned intervals, computed afresh (nothing shared between threads)."""
        return Timeline.from_records(self.rewind_records())

    def is_active(self, seq: int) -> bool:
        """Whether `seq` is on the current timeline: one indexed row (no row: 0, or
        below the retained log, where no abandoned branch crosses)."""
        row = self.database.execute_sql(
            self._sql("SELECT active FROM session_log WHERE seq = ?"), [seq]
        ).fetchone()
        return row is None or bool(row[0])

    def abandoned_among(self, seqs: Sequence[int]) -> set[int]:
        """Which of a page's sequences are abandoned: one statement."""
        if not seqs:
            return set()
        marks = ", ".join("?" for _ in seqs)
        rows = self.database.execute_sql(
            self._sql(f"SELECT seq FROM session_log WHERE seq IN ({marks}) AND active = ?"),
            [*seqs, False],
        ).fetchall()
        return {int(row[0]) for row in rows}

    def _payloads(self, sql: str, params: Sequence[Any]) -> list[Event]:
        """The events of a statement selecting (format, payload)."""
        rows = self.database.execute_sql(sql, params).fetchall()
        return [storage_format.decode_event(int(fmt), payload) for fmt, payload in rows]

    def _active(self) -> peewee.Expression:
        return self.Event.active == True  # noqa: E712 - SQL, not Python

    def add_rewind(self, seq: int, target: int) -> None:
        self.Rewind.insert(seq=seq, target=target).execute()

    def move_effect(self, first: int, last: int, active: bool) -> list[tuple[str, str, int]]:
        """(agent, session id or "", events) for the log rows in [first, last] whose
        marker is `active` now, rewind records left out; a move's bookkeeping
        (RewindApplied) is listed with 0 events, so its entity is refreshed too."""
        rows = self.database.execute_sql(
            self._sql(
                "SELECT agent, session_id, "
                "SUM(CASE WHEN kind = 'rewind_applied' THEN 0 ELSE 1 END) "
                "FROM session_log WHERE seq >= ? AND seq <= ? AND active = ? "
                f"AND kind NOT IN ({_LOG_RECORD_KINDS_SQL}) GROUP BY agent, session_id"
            ),
            [first, last, active],
        ).fetchall()
        return [
            (str(agent), str(session_id or ""), int(count)) for agent, session_id, count in rows
        ]

    def mark(self, first: int, last: int, active: bool) -> None:
        """Sets the marker of the log rows and snapshots in [first, last]; guarded, so
        only rows whose status changes are written. Audit records keep theirs."""
        for table, kept in (
            ("session_log", f" AND kind NOT IN ({_NEVER_ABANDONED_SQL})"),
            ("session_snapshot", ""),
        ):
            self.database.execute_sql(
                self._sql(
                    f"UPDATE {table} SET active = ? WHERE seq >= ? AND seq <= ? AND active = ?"
                    + kept
                ),
                [active, first, last, not active],
            )

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

    def retained_from(self) -> int:
        return int(self.Retention.get_by_id(1).retained_from)

    def entities_needing_events_below(self, seq: int) -> list[str]:
        """Entities whose state at `seq` or later would need a log event below `seq`.

        Each entity with events below `seq` needs an active snapshot taken at or
        after its last such event and no later than `seq`; and no abandoned branch
        may cross `seq` (a checkout onto it would need its deleted start).
        """
        if not self.is_active(seq):
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
            self._sql(
                "SELECT agent, session_id FROM (SELECT DISTINCT agent, session_id "
                "FROM session_log WHERE seq < ? AND kind <> 'rewound') AS l "
                "WHERE CASE WHEN session_id IS NULL "
                "THEN NOT EXISTS (SELECT 1 FROM session_agent WHERE name = l.agent) "
                "ELSE NOT EXISTS (SELECT 1 FROM session_session AS s "
                "WHERE s.session_id = l.session_id) END"
            ),
            [seq],
        ).fetchall()
        for agent, session_id in undone:
            entity = session_entity(session_id) if session_id else agent_entity(agent)
            version = self.highest_version(entity)  # the floor's old value included
            self.VersionFloor.insert(entity=entity, version=version).on_conflict(
                conflict_target=[self.VersionFloor.entity],
                update={self.VersionFloor.version: version},
            ).execute()

    # -- checkpoints ------------------------------------------------------------------------

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

    def _row_sql(self, table: str, columns: Sequence[str]) -> tuple[str, str]:
        """SELECT by key, and the upsert of a projection row (key first): one statement
        with no row count to wait for, so it can travel with the log's INSERT."""
        key, rest = columns[0], columns[1:]
        return (
            self._sql(f"SELECT {', '.join(columns)} FROM {table} WHERE {key} = ?"),
            self._sql(
                f"INSERT INTO {table} ({', '.join(columns)}) "
                f"VALUES ({', '.join('?' for _ in columns)}) ON CONFLICT ({key}) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in rest)
            ),
        )

    def _sql(self, text: str) -> str:
        return text.replace("?", self._q)

    # -- the log ----------------------------------------------------------------------------

    def head(self) -> int:
        return int(self.Head.get_by_id(1).seq)

    def _write(self, sql: str, params: Sequence[Any]) -> None:
        """A log INSERT or projection upsert: nothing reads its answer, so the backend
        may send it with the transaction's next statement (`Backend.execute_later`)."""
        self.backend.execute_later(sql, params)

    def lock_log(self) -> None:
        """Takes the log's write lock for the rest of the transaction; the runner calls
        it first in every write transaction of the SessionService.

        Every version check, existence check and projection read of a write then
        happens under the lock its write needs anyway (appending moves the head), so
        checks and writes can never interleave with another writer's, whatever the
        number of writer threads and replicas. On SQLite the IMMEDIATE transaction
        holds the database's write lock already; on Postgres this locks the head row.
        """
        self.database.execute_sql(
            f"SELECT seq FROM session_log_head WHERE id = 1{self.backend.for_update}"
        )

    def append(self, events: Sequence[Event], now: float) -> list[Event]:
        """Gives the events the next sequences (in this transaction) and logs them."""
        row = self.database.execute_sql(
            self._sql("UPDATE session_log_head SET seq = seq + ? WHERE id = 1 RETURNING seq"),
            [len(events)],
        ).fetchone()
        first = int(row[0]) - len(events) + 1
        rows = []
        for offset, event in enumerate(events):
            event.sequence = first + offset
            event.time = int(now * 1e9)
            rows.append(
                (
                    event.sequence,
                    event.agent,
                    event.session_id or None,
                    event.body.kind,
                    storage_format.CURRENT,
                    storage_format.encode_event(event),
                    _tool_ref(event),
                    True,  # above every rewind record, so inside no abandoned interval
                    _inbound_ref(event),
                )
            )
        for row in rows:
            self._write(self._insert_events, row)
        self.backend.notify(LOG_CHANNEL)  # wakes other replicas' watchers at commit
        return list(events)

    def read(
        self,
        after_seq: int,
        limit: int,
        agent: str = "",
        session_id: str = "",
    ) -> list[Event]:
        query = self.Event.select(self.Event.format, self.Event.payload).where(
            self.Event.seq > after_seq
        )
        is_rewind = self.Event.kind == "rewound"
        if agent:
            query = query.where((self.Event.agent == agent) | is_rewind)
        if session_id:
            query = query.where((self.Event.session_id == session_id) | is_rewind)
        rows = tuples(query.order_by(self.Event.seq).limit(limit))
        return [storage_format.decode_event(int(fmt), payload) for fmt, payload in rows]

    def read_page(
        self,
        after_seq: int,
        until_seq: int | None,
        limit: int,
        max_bytes: int,
        agent: str = "",
        session_id: str = "",
    ) -> tuple[list[Event], bool]:
        """Up to `limit` events after `after_seq` (up to `until_seq`) filtered as `read`,
        stopping before the one that would pass `max_bytes` (the first always comes), in
        one statement; and whether more are left. Rows past the budget come back as
        NULLs, so their payloads never leave the database."""
        where, params = ["seq > ?"], [after_seq]
        if until_seq is not None:
            where.append("seq <= ?")
            params.append(until_seq)
        for column, value in (("agent", agent), ("session_id", session_id)):
            if value:
                where.append(f"({column} = ? OR kind = 'rewound')")
                params.append(value)  # type: ignore[arg-type]
        sql = self._sql(
            "SELECT format, CASE WHEN upto - size < ? THEN payload END FROM ("
            "SELECT seq, format, payload, LENGTH(payload) AS size, "
            "SUM(LENGTH(payload)) OVER (ORDER BY seq) AS upto FROM session_log "
            f"WHERE {' AND '.join(where)} ORDER BY seq LIMIT ?) AS page ORDER BY seq"
        )
        rows = self.database.execute_sql(sql, [max_bytes, *params, limit + 1]).fetchall()
        kept = [(int(fmt), payload) for fmt, payload in rows[:limit] if payload is not None]
        events = [storage_format.decode_event(fmt, payload) for fmt, payload in kept]
        return events, len(rows) > len(events)

    def accepted_post(self, session_id: str, message_ref: str) -> Event | None:
        """The active inbox post of the session that carries `message_ref`, if any:
        one indexed row. A session accepts one post per message_ref among its active
        rows (the unique index `INBOUND_REF_INDEX` holds it): abandoned posts and
        deleted ones count for nothing."""
        row = self.database.execute_sql(
            self._select_accepted_post, [session_id, message_ref]
        ).fetchone()
        return None if row is None else storage_format.decode_event(int(row[0]), row[1])

    def highest_version(self, entity: str) -> int:
        """The highest version the agent or session ever had, on any branch, truncated
        ones included: 0 for one never logged. New versions start above it, so that
        none ever repeats."""
        kind, where, key = _entity_filter(entity)
        index = self.agent_index(key) if kind == "agent" else self.session_index(key)
        projected = 0 if index is None else index.version
        # The version floor a truncation left, beside the newest event: one statement.
        row = self.database.execute_sql(
            self._sql(
                "SELECT f.version, n.format, n.payload FROM (SELECT 1 AS one) AS o "
                "LEFT JOIN session_version_floor AS f ON f.entity = ? LEFT JOIN "
                f"(SELECT format, payload FROM session_log WHERE {where} "
                "ORDER BY seq DESC LIMIT 1) AS n ON 1 = 1"
            ),
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
        count = self.database.execute_sql(
            self._sql(f"SELECT COUNT(*) FROM session_log WHERE {where}"), [key]
        ).fetchone()[0]
        return max(known, int(count))

    def entity_events(
        self,
        entity: str,
        after_seq: int,
        until: int | None = None,
    ) -> list[Event]:
        _, where, key = _entity_filter(entity)
        bound = "" if until is None else " AND seq <= ?"
        sql = self._sql(
            f"SELECT format, payload FROM session_log WHERE {where} AND active = ? "
            f"AND seq > ?{bound} ORDER BY seq"
        )
        return self._payloads(sql, [key, True, after_seq, *([] if until is None else [until])])

    def add_lineage(self, session_id: str, parent_id: str, until_seq: int) -> None:
        """Records a fork's ancestors (one statement; a replay writes the same rows)."""
        params = [session_id, parent_id, session_id, parent_id, until_seq]
        self.database.execute_sql(self._insert_lineage, params)

    def history(
        self,
        session_id: str,
        after_seq: int,
        before_seq: int | None,
        limit: int,
        newest: bool,
        include_abandoned: bool,
        budget: int,
        shared: bool = False,
    ) -> tuple[list[Event], bool]:
        """The oldest (or `newest`) history messages in (after, before), at most `limit`
        and `budget` bytes, oldest first; and whether more lie beyond them. `shared`:
        the session is a fork sharing its ancestors' history (see `LineageRow`)."""
        conditions: list[str] = ["kind = 'message_appended'", "seq > ?"]
        params: list[Any] = [after_seq]
        if before_seq is not None:
            conditions.append("seq < ?")
            params.append(before_seq)
        if not include_abandoned:
            conditions.append("active = ?")
            params.append(True)
        # Hook (issue 23): messages the session (or an ancestor before its fork
        # point) retracted are no longer history (`retraction_store`).
        conditions.append(NOT_RETRACTED)
        params += [session_id, session_id]
        if not shared:
            where = " AND ".join(["session_id = ?", *conditions])
            return self._sized_page(where, [session_id, *params], newest, limit, budget)
        # The fork's own rows lie above its fork point, its parent's below it, and so
        # on up the lineage: segments of the one history, each read as a bounded page
        # in the page's direction until the page is full. So a page costs what it
        # holds (plus one lookup of the lineage), never the length of what it inherits.
        segments = [(session_id, None), *self._ancestors(session_id)]
        if not newest:
            segments.reverse()
        events: list[Event] = []
        for number, (entity, until) in enumerate(segments):
            where, segment_params = _segment(entity, until, conditions, params)
            left = budget - sum(convert.encoded_size(event) for event in events)
            page, more = self._sized_page(
                where, segment_params, newest, limit - len(events), left, first_always=not events
            )
            events = page + events if newest else events + page
            if more:
                return events, True
            if len(events) == limit:
                return events, self._any_in(segments[number + 1 :], conditions, params)
        return events, False

    def _ancestors(self, session_id: str) -> list[tuple[str, int]]:
        """A fork's ancestors, newest first: (ancestor's session id, its fork point)."""
        rows = self.database.execute_sql(
            self._sql(
                "SELECT ancestor_id, until_seq FROM session_lineage WHERE session_id = ? "
                "ORDER BY until_seq DESC"
            ),
            [session_id],
        ).fetchall()
        return [(str(ancestor), int(until)) for ancestor, until in rows]

    def _any_in(
        self, segments: list[tuple[str, int | None]], conditions: list[str], params: list[Any]
    ) -> bool:
        """Whether any of the segments holds a matching row (a page that filled up at
        the end of a segment: is there a next page?)."""
        for entity, until in segments:
            where, segment_params = _segment(entity, until, conditions, params)
            sql = self._sql(f"SELECT 1 FROM session_log WHERE {where} LIMIT 1")
            if self.database.execute_sql(sql, segment_params).fetchone() is not None:
                return True
        return False

    def log_page(
        self,
        after_seq: int,
        before_seq: int | None,
        agent: str,
        session_id: str,
        kinds: Sequence[str],
        branch: int,
        limit: int,
        budget: int,
        newest: bool = False,
    ) -> tuple[list[tuple[Event, bool]], bool]:
        """A page of the global log in sequence order, each event with whether it is
        abandoned (`branch`: a LogBranch); and whether more match beyond it (after
        it, or with `newest`, the top of the matching events, before it)."""
        # No lower bound unless one is asked for: SQLite bounds a range scan by the first
        # one it meets, and a "seq > 0" would make a newest page's rows read from the start.
        where, params = ("seq > ?", list[Any]([after_seq])) if after_seq else ("1 = 1", [])
        for column, value in (("agent", agent), ("session_id", session_id)):
            if value:
                where += f" AND {column} = ?"
                params.append(value)
        if before_seq is not None:
            where += " AND seq < ?"
            params.append(before_seq)
        if kinds:
            where += f" AND kind IN ({', '.join('?' for _ in kinds)})"
            params.extend(kinds)
        if branch in (LogBranch.ACTIVE, LogBranch.ABANDONED):
            where += " AND active = ?"
            params.append(branch == LogBranch.ACTIVE)
        events, more = self._sized_page(where, params, newest, limit, budget)
        abandoned = self.abandoned_among([event.sequence for event in events])
        return [(event, event.sequence in abandoned) for event in events], more

    def _sized_page(
        self,
        where: str,
        params: list[Any],
        descending: bool,
        limit: int,
        budget: int,
        first_always: bool = True,
    ) -> tuple[list[Event], bool]:
        """Events matching `where`, by sequence (from the top when `descending`), as many
        as `limit` and `budget` bytes allow, returned oldest first; and whether more
        match. Two statements: the rows' sizes (the payloads' lengths, which the
        database knows without reading them), then the payloads of the rows that fit;
        so no more than a page is ever loaded, however large the rows. The first row
        comes even past the budget (so paging moves on) unless not `first_always`."""
        order = "DESC" if descending else "ASC"
        sizes = self.database.execute_sql(
            self._sql(
                f"SELECT seq, LENGTH(payload) FROM session_log WHERE {where} "
                f"ORDER BY seq {order} LIMIT {int(limit) + 1}"
            ),
            params,
        ).fetchall()
        lengths = [int(size) for _, size in sizes[:limit]]
        kept = pagination.fitting(lengths, budget)
        if kept and not first_always and lengths[0] > budget:
            kept = 0
        seqs = sorted(int(seq) for seq, _ in sizes[:kept])
        if not seqs:
            return [], len(sizes) > kept
        # The kept rows are the matching rows between the first and the last of them:
        # one statement whose text does not depend on the page's length (the LIMIT
        # holds it to the page should a concurrent checkout restore rows in between).
        events = self._payloads(
            self._sql(
                f"SELECT format, payload FROM session_log WHERE {where} AND seq >= ? "
                "AND seq <= ? ORDER BY seq LIMIT ?"
            ),
            [*params, seqs[0], seqs[-1], len(seqs)],
        )
        return events, len(sizes) > kept

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

    # -- snapshots --------------------------------------------------------------------------

    def latest_snapshot(
        self, entity: str, kind: type[S], until: int | None = None
    ) -> tuple[int, S] | None:
        """The newest snapshot whose sequence is active (one taken at a sequence a
        rewind later abandoned describes a state that no longer exists), and its seq."""
        bound = "" if until is None else " AND seq <= ?"
        sql = self._sql(
            "SELECT seq, format, state FROM session_snapshot "
            f"WHERE entity = ? AND active = ?{bound} ORDER BY seq DESC LIMIT 1"
        )
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

    # -- states -----------------------------------------------------------------------------

    def agent_state(self, name: str, until: int | None = None) -> Agent | None:
        return self._state(agent_entity(name), Agent, replay.apply_to_agent, until)

    def session_state(self, session_id: str, until: int | None = None) -> SessionState | None:
        return self._state(session_entity(session_id), SessionState, replay.apply_to_session, until)

    def _state(
        self,
        entity: str,
        kind: type[S],
        apply: Callable[[S, Event], None],
        until: int | None = None,
    ) -> S | None:
        """Latest snapshot + the entity's later events (up to `until`); None for an
        entity with neither. Two statements: the snapshot, the tail."""
        snapshot = self.latest_snapshot(entity, kind, until)
        after, state = (0, None) if snapshot is None else snapshot
        tail = self.entity_events(entity, after, until)
        if state is None:
            if not tail:
                return None
            state = kind()
        for event in tail:
            apply(state, event)
        return state

    # -- projections ------------------------------------------------------------------------

    # The projection rows are read and written on every append: prepared SQL,
    # because building these statements with peewee cost more than running them.

    def agent_index(self, name: str) -> AgentIndex | None:
        row = self.database.execute_sql(self._select_agent, [name]).fetchone()
        if row is None:
            return None
        return _agent_index(row)

    def put_agent_index(self, index: AgentIndex) -> None:
        if index.summary is None:  # written without one (a rewind's refresh): fold it
            agent = self.agent_state(index.name)
            summary = None if agent is None else serialized_summary(agent_summary(agent))
            index = replace(index, summary=summary)
        self._write(self._upsert_agent, [getattr(index, column) for column in _AGENT_COLUMNS])

    def list_agents(self, after_name: str, limit: int, include_archived: bool) -> list[AgentIndex]:
        """A page of agent rows by name, summaries included: one statement."""
        live = "" if include_archived else " AND archived = ?"
        sql = self._sql(
            f"SELECT {', '.join(_AGENT_COLUMNS)} FROM session_agent WHERE name > ?{live} "
            "ORDER BY name LIMIT ?"
        )
        params = [after_name, *([] if include_archived else [False]), limit]
        return [_agent_index(row) for row in self.database.execute_sql(sql, params).fetchall()]

    def session_index(self, session_id: str) -> SessionIndex | None:
        row = self.database.execute_sql(self._select_session, [session_id]).fetchone()
        if row is None:
            return None
        return _session_index(dict(zip(_SESSION_COLUMNS, row, strict=True)))

    def put_session_index(self, index: SessionIndex) -> None:
        if index.summary is None:  # written without one (a rewind's refresh): fold it
            state = self.session_state(index.session_id)
            summary = (
                None
                if state is None or state.session is None
                else serialized_summary(state.session)
            )
            index = replace(index, summary=summary)
        self._write(self._upsert_session, [getattr(index, column) for column in _SESSION_COLUMNS])

    def list_sessions(
        self,
        agent: str,
        status: int,
        transport: str,
        before_created_seq: int | None,
        limit: int,
        routing_key: str = "",
        user_id: str = "",
    ) -> list[SessionIndex]:
        """Newest first; every agent's sessions for `agent` "". `user_id` (with an
        agent): only the sessions of that user (hook, issue 23: `session_user_store`)."""
        query = self.Session.select()
        if agent:
            query = query.where(self.Session.agent == agent)
        if user_id:
            query = query.where(
                peewee.SQL(
                    self._sql(
                        "session_id IN (SELECT session_id FROM session_of_user "
                        "WHERE agent = ? AND user_id = ?)"
                    ),
                    [agent, user_id],
                )
            )
        if routing_key:
            query = query.where(self.Session.routing_key == routing_key)
        if status:
            query = query.where(self.Session.status == status)
        if transport:
            query = query.where(self.Session.transport == transport)
        if before_created_seq is not None:
            query = query.where(self.Session.created_seq < before_created_seq)
        rows = dicts(query.order_by(self.Session.created_seq.desc()).limit(limit))
        return [_session_index(row) for row in rows]

    def resumable(self, agent: str) -> list[SessionIndex]:
        query = self.Session.select().where(
            (self.Session.agent == agent)
            & (self.Session.resume_pending == True)  # noqa: E712 - SQL, not Python
            & (self.Session.status == SessionStatus.OPEN)
        )
        return [_session_index(row) for row in dicts(query.order_by(self.Session.created_seq))]

    def routed_session(self, agent: str, routing_key: str) -> SessionIndex | None:
        """The projection row of the session a routing key points to (one statement)."""
        row = self.database.execute_sql(self._select_routed_session, [agent, routing_key])
        found = row.fetchone()
        return (
            None
            if found is None
            else _session_index(dict(zip(_SESSION_COLUMNS, found, strict=True)))
        )

    def unsummarized(self) -> tuple[list[str], list[str]]:
        """(agent names, session ids) of projection rows without a summary yet."""
        agents = self.Agent.select(self.Agent.name).where(self.Agent.summary.is_null())
        sessions = self.Session.select(self.Session.session_id).where(
            self.Session.summary.is_null()
        )
        return (
            [str(name) for (name,) in tuples(agents)],
            [str(session_id) for (session_id,) in tuples(sessions)],
        )

    def key_report(self) -> list[dict[str, Any]]:
        """The rows of `session_key_report` (the upgrade to injective keys), in no order."""
        return dicts(self.KeyReport.select())

    def route(self, agent: str, routing_key: str) -> str | None:
        row = (
            self.Route.select(self.Route.session_id)
            .where((self.Route.agent == agent) & (self.Route.routing_key == routing_key))
            .tuples()
            .first()
        )
        return None if row is None else str(row[0])

    def claim_route(self, agent: str, routing_key: str, session_id: str) -> bool:
        """Points a free routing key at a session; False when another session holds it."""
        inserted = (
            self.Route.insert(agent=agent, routing_key=routing_key, session_id=session_id)
            .on_conflict_ignore()
            .as_rowcount()
            .execute()
        )
        return bool(inserted)

    def set_route(self, agent: str, routing_key: str, session_id: str) -> None:
        self.Route.insert(agent=agent, routing_key=routing_key, session_id=session_id).on_conflict(
            conflict_target=[self.Route.agent, self.Route.routing_key],
            update={self.Route.session_id: session_id},
        ).execute()

    def drop_route(self, agent: str, routing_key: str, session_id: str) -> None:
        self.Route.delete().where(
            (self.Route.agent == agent)
            & (self.Route.routing_key == routing_key)
            & (self.Route.session_id == session_id)
        ).execute()

    def clear_projections(self) -> None:
        for model in (self.Agent, self.Session, self.Route, self.Lineage):
            model.delete().execute()

    def projection_rows(self) -> dict[str, set[tuple[Any, ...]]]:
        """Every projection row as the log defines it, for comparing before and after
        a rebuild (snapshot bookkeeping is cache state, so it is left out)."""
        rows: dict[str, set[tuple[Any, ...]]] = {}
        for name, model in (
            ("agents", self.Agent),
            ("sessions", self.Session),
            ("routes", self.Route),
            ("lineage", self.Lineage),
        ):
            columns = [f for n, f in model._meta.fields.items() if n != "snapshot_version"]
            rows[name] = {
                tuple(bytes(v) if isinstance(v, memoryview) else v for v in row)
                for row in tuples(model.select(*columns))
            }
        return rows

    def head_and_snapshot_lag(self) -> tuple[int, int]:
        lag = self.database.execute_sql(
            "SELECT MAX(version - snapshot_version) FROM session_session"
        ).fetchone()[0]
        return self.head(), int(lag or 0)

    def max_logged_seq(self) -> int:
        value = self.Event.select(peewee.fn.MAX(self.Event.seq)).scalar()
        return int(value or 0)

    def replayable_event_count(self) -> int:
        """How many events `active_events` yields (a rebuild's total)."""
        query = self.Event.select().where(self.Event.kind.not_in(LOG_RECORD_KINDS) & self._active())
        return int(query.count())

    def delete_agent_index(self, name: str) -> None:
        self.Agent.delete().where(self.Agent.name == name).execute()

    def delete_session_index(self, session_id: str) -> None:
        """A session a rewind undid: its row and, for a fork, its lineage."""
        self.Session.delete().where(self.Session.session_id == session_id).execute()
        self.Lineage.delete().where(self.Lineage.session_id == session_id).execute()

    def drop_routes_to(self, session_ids: Iterable[str]) -> None:
        self.Route.delete().where(self.Route.session_id.in_(list(session_ids))).execute()

    def active_events(self, batch: int = 5000) -> Iterable[Event]:
        """Every active event except rewind records, in order (what a rebuild replays)."""
        after = 0
        while True:
            query = (
                self.Event.select(self.Event.format, self.Event.payload)
                .where(
                    (self.Event.seq > after)
                    & self.Event.kind.not_in(LOG_RECORD_KINDS)
                    & self._active()
                )
                .order_by(self.Event.seq)
                .limit(batch)
            )
            events = [storage_format.decode_event(int(f), p) for f, p in tuples(query)]
            if not events:
                return
            yield from events
            after = events[-1].sequence


def _segment(
    session_id: str, until: int | None, conditions: list[str], params: list[Any]
) -> tuple[str, list[Any]]:
    """The SQL condition and parameters selecting one segment of a shared history: a
    session's rows matching `conditions`, up to its fork point `until` (None: all)."""
    where = " AND ".join(["session_id = ?", *conditions])
    if until is None:
        return where, [session_id, *params]
    return f"{where} AND seq <= ?", [session_id, *params, until]


def _entity_filter(entity: str) -> tuple[str, str, str]:
    """("agent" or "session", the SQL condition selecting its log rows, its key)."""
    kind, _, key = entity.partition(":")
    where = "agent = ? AND session_id IS NULL" if kind == "agent" else "session_id = ?"
    return kind, where, key


def _inbound_ref(event: Event) -> str | None:
    """The message_ref an inbox post is accepted under (None: no such rule for it)."""
    if isinstance(event.body, InboxPosted) and event.body.message is not None:
        return event.body.message.message_ref or None
    return None


def _tool_ref(event: Event) -> str | None:
    if not isinstance(event.body, MessageAppended) or event.body.message is None:
        return None
    message = event.body.message
    if message.role == Role.TOOL and message.tool_call_id:
        return f"r:{message.tool_call_id}"
    if message.tool_calls:
        return "c:" + "\n".join(call.id for call in message.tool_calls)
    return None
