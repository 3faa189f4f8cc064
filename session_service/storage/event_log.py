"""The event log's recorder: an append gives events the next sequences in its
transaction, reads return them in sequence order.

Its interface is what every storage backend must keep alike, and what the backend
contract test (tests/session/storage/) runs on each: `append`, `read`, `read_page`,
`head`, `entity_events`, `accepted_post`, `is_active`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import peewee

from session_service import storage_format
from session_service.records import Event, InboxPosted, MessageAppended, Role
from session_service.storage import queries
from session_service.storage.kinds import LOG_RECORD_KINDS, REWOUND
from session_service.storage.schema import ACCEPTED_POSTS, Part, Tables
from switchboard.database import tuples

#: The channel appends are announced on (Postgres NOTIFY), for other replicas' watchers.
LOG_CHANNEL = "switchboard_session_log"


def agent_entity(name: str) -> str:
    return f"agent:{name}"


def session_entity(session_id: str) -> str:
    return f"session:{session_id}"


def entity_filter(entity: str) -> tuple[str, str, str]:
    """("agent" or "session", the SQL condition selecting its log rows, its key)."""
    kind, _, key = entity.partition(":")
    where = "agent = ? AND session_id IS NULL" if kind == "agent" else "session_id = ?"
    return kind, where, key


class EventLog(Part):
    def __init__(self, tables: Tables) -> None:
        super().__init__(tables)
        self._insert_events = self._sql(queries.INSERT_EVENT)
        self._select_accepted_post = self._sql(queries.accepted_post(ACCEPTED_POSTS))

    def head(self) -> int:
        return int(self.Head.get_by_id(1).seq)

    def lock_log(self) -> None:
        """Takes the log's write lock for the rest of the transaction; the runner calls
        it first in every write transaction of the SessionService.

        Every version check, existence check and projection read of a write then
        happens under the lock its write needs anyway (appending moves the head), so
        checks and writes can never interleave with another writer's, whatever the
        number of writer threads and replicas. On SQLite the IMMEDIATE transaction
        holds the database's write lock already; on Postgres this locks the head row,
        sent with the transaction's first real statement (the lock is taken before that
        statement runs) rather than costing a round trip of its own while it is held.
        """
        self.backend.execute_later(queries.lock_head(self.backend.for_update), ())

    def append(self, events: Sequence[Event], now: float) -> list[Event]:
        """Gives the events the next sequences (in this transaction) and logs them."""
        row = self.database.execute_sql(
            self._sql(queries.MOVE_HEAD),
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
        is_rewind = self.Event.kind == REWOUND
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
        in one statement, and whether more are left. The page ends with the event whose
        payload reaches `max_bytes` (so it holds at least one event and passes the
        budget by at most one); rows after it come back as NULLs, so their payloads
        never leave the database."""
        where, params = ["seq > ?"], [after_seq]
        if until_seq is not None:
            where.append("seq <= ?")
            params.append(until_seq)
        for column, value in (("agent", agent), ("session_id", session_id)):
            if value:
                where.append(queries.rewind_or(column))
                params.append(value)  # type: ignore[arg-type]
        sql = self._sql(queries.page_within_budget(" AND ".join(where)))
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

    def entity_events(
        self,
        entity: str,
        after_seq: int,
        until: int | None = None,
    ) -> list[Event]:
        _, where, key = entity_filter(entity)
        sql = self._sql(queries.entity_events(where, bounded=until is not None))
        return self.payloads(sql, [key, True, after_seq, *([] if until is None else [until])])

    def is_active(self, seq: int) -> bool:
        """Whether `seq` is on the current timeline: one indexed row (no row: 0, or
        below the retained log, where no abandoned branch crosses)."""
        row = self.database.execute_sql(self._sql(queries.IS_ACTIVE), [seq]).fetchone()
        return row is None or bool(row[0])

    def abandoned_among(self, seqs: Sequence[int]) -> set[int]:
        """Which of a page's sequences are abandoned: one statement."""
        if not seqs:
            return set()
        rows = self.database.execute_sql(
            self._sql(queries.abandoned_among(len(seqs))),
            [*seqs, False],
        ).fetchall()
        return {int(row[0]) for row in rows}

    def payloads(self, sql: str, params: Sequence[Any]) -> list[Event]:
        """The events of a statement selecting (format, payload)."""
        rows = self.database.execute_sql(sql, params).fetchall()
        return [storage_format.decode_event(int(fmt), payload) for fmt, payload in rows]

    def max_logged_seq(self) -> int:
        value = self.Event.select(peewee.fn.MAX(self.Event.seq)).scalar()
        return int(value or 0)

    def replayable_event_count(self) -> int:
        """How many events `active_events` yields (a rebuild's total)."""
        query = self.Event.select().where(self.Event.kind.not_in(LOG_RECORD_KINDS) & self._active())
        return int(query.count())

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
