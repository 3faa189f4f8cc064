"""Erasure's storage: what it rewrites and deletes, and what it remembers.

- Rewrites: an erased session's log rows become tombstones in place (kind
  `erased`, the payload an `Erased` event that keeps only the row's sequence,
  agent and session id), and a RecordsPut row whose records are erased is
  re-encoded with those records as empty placeholders.
- Deletes: the session's snapshots and projection rows, and the remembered
  answers of request ids that name it (`session_request_subject` says which: the
  sessions a request or its answer names, written with the answer).
- Remembers: `session_erased_id` (erased session ids) and `session_erased_key`
  (a digest of each erased routing key, keyed with the PII key when the server has
  one, never the key: it holds user ids), so that resolving or spawning them again
  is refused unless asked for.

On SQLite the session database runs with `secure_delete` on (freed pages and
cells are zeroed), and `checkpoint_wal` empties the write-ahead log afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import peewee

from session_service import pii, storage_format
from session_service.records import Erased, Event
from session_service.storage import queries
from session_service.storage.kinds import ERASED
from switchboard.database import Backend, bind_model
from switchboard.sqlite_backend import SqliteBackend

#: The request-record table erasure deletes from, and its subjects.
REQUEST_SUBJECTS = "session_request_subject"


class ErasedIdRow(peewee.Model):
    session_id = peewee.CharField(max_length=128, primary_key=True)
    agent = peewee.CharField(max_length=64)
    erased_seq = peewee.BigIntegerField()  # the Erasure record

    class Meta:
        table_name = "session_erased_id"


class ErasedKeyRow(peewee.Model):
    agent = peewee.CharField(max_length=64)
    key_digest = peewee.CharField(max_length=64)  # sha256 hex of the routing key
    erased_seq = peewee.BigIntegerField()

    class Meta:
        table_name = "session_erased_key"
        primary_key = peewee.CompositeKey("agent", "key_digest")


class RequestSubjectRow(peewee.Model):
    session_id = peewee.CharField(max_length=128)
    principal = peewee.CharField(max_length=160)
    request_id = peewee.CharField(max_length=64)
    created_at = peewee.DoubleField(index=True)

    class Meta:
        table_name = REQUEST_SUBJECTS
        primary_key = peewee.CompositeKey("session_id", "principal", "request_id")


def tombstone(seq: int, agent: str, session_id: str) -> bytes:
    """An erased row's payload: its place in the log, nothing of what it said."""
    return storage_format.encode_event(
        Event(sequence=seq, agent=agent, session_id=session_id, body=Erased())
    )


class ErasureStore:
    def __init__(self, backend: Backend, redactor: pii.Redactor) -> None:
        self.backend = backend
        self.redactor = redactor
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.ErasedId = bind_model(ErasedIdRow, self.database)
        self.ErasedKey = bind_model(ErasedKeyRow, self.database)
        self.Subject = bind_model(RequestSubjectRow, self.database)
        self.models = (self.ErasedId, self.ErasedKey, self.Subject)

    def _run(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.database.execute_sql(self._sql(sql), list(params))

    # -- remembered erasures ----------------------------------------------------------------

    def erased_id(self, session_id: str) -> int | None:
        """The sequence of the erasure of this session id, if it was erased."""
        row = self._run(queries.ERASED_ID, [session_id]).fetchone()
        return None if row is None else int(row[0])

    def erased_key(self, agent: str, routing_key: str) -> int | None:
        row = self._run(queries.ERASED_KEY, [agent, self._digest(routing_key)]).fetchone()
        return None if row is None else int(row[0])

    def _digest(self, routing_key: str) -> str:
        """A routing key as remembered: a digest keyed like redacted ids (a plain one
        of a key holding a short user id gives the id away to brute force)."""
        return self.redactor.digest(routing_key, chars=64)

    def remember(self, agent: str, session_id: str, routing_key: str, seq: int) -> None:
        self._run(queries.REMEMBER_ERASED_ID, [session_id, agent, seq])
        if routing_key:
            self._run(queries.REMEMBER_ERASED_KEY, [agent, self._digest(routing_key), seq])

    def forget_id(self, session_id: str) -> None:
        """A reopened id: no longer refused (a later erasure remembers it again)."""
        self._run(queries.FORGET_ERASED_ID, [session_id])

    def forget_key(self, agent: str, routing_key: str) -> None:
        self._run(queries.FORGET_ERASED_KEY, [agent, self._digest(routing_key)])

    # -- rewriting the log ------------------------------------------------------------------

    def session_rows(self, session_id: str) -> list[tuple[int, str]]:
        """(sequence, kind) of every log row of the session, any branch."""
        rows = self._run(queries.SESSION_ROWS, [session_id]).fetchall()
        return [(int(seq), str(kind)) for seq, kind in rows]

    def tombstone_rows(self, agent: str, session_id: str, seqs: Iterable[int]) -> int:
        """Each row becomes a tombstone in place; how many (already erased ones too)."""
        count = 0
        sql = self._sql(queries.TOMBSTONE_ROW)
        for seq in seqs:
            self.database.execute_sql(
                sql,
                [ERASED, storage_format.CURRENT, tombstone(seq, agent, session_id), seq],
            )
            count += 1
        return count

    def rewrite_row(self, seq: int, event: Event) -> None:
        """A log row re-encoded (a RecordsPut with records erased)."""
        self._run(
            queries.REWRITE_ROW,
            [storage_format.CURRENT, storage_format.encode_event(event), seq],
        )

    def log_rows(self, seqs: Sequence[int]) -> list[tuple[int, Event]]:
        if not seqs:
            return []
        rows = self._run(queries.log_rows(len(seqs)), seqs).fetchall()
        return [(int(seq), storage_format.decode_event(int(f), p)) for seq, f, p in rows]

    def abandoned_puts(self, agent: str, session_id: str) -> list[tuple[int, Event]]:
        """The RecordsPut rows a rewind abandoned, of one session or (session "") of
        every session of the agent: their records are erased too, or a checkout
        would restore them."""
        rows = self._run(
            queries.abandoned_puts(of_session=bool(session_id)), [session_id or agent, False]
        ).fetchall()
        return [(int(seq), storage_format.decode_event(int(f), p)) for seq, f, p in rows]

    # -- deleting projections ---------------------------------------------------------------

    def drop_session_rows(self, session_id: str) -> None:
        """The session's snapshots and the core's projection rows of it."""
        self._run(queries.DROP_SESSION_SNAPSHOTS, [f"session:{session_id}"])
        for sql in queries.DROP_SESSION_PROJECTIONS:
            self._run(sql, [session_id])

    def drop_answers_naming(self, session_id: str, request_table: str) -> int:
        """The remembered answers of requests that named the session: a retry of
        one runs again (and finds the session gone)."""
        deleted = self._run(
            queries.drop_answers_naming(request_table, REQUEST_SUBJECTS), [session_id]
        ).rowcount
        self._run(queries.drop_subjects_of(REQUEST_SUBJECTS), [session_id])
        return int(deleted or 0)

    # -- after the commit -------------------------------------------------------------------

    def checkpoint_wal(self) -> bool:
        """SQLite: copies the write-ahead log into the database and truncates it, so
        that it holds no copy of erased pages (outside a transaction; SQLite waits up
        to the busy timeout for readers of older snapshots). True once done, False
        while readers still hold it. Postgres: nothing to do (True)."""
        if not isinstance(self.backend, SqliteBackend):
            return True
        busy = self.database.execute_sql(queries.WAL_CHECKPOINT).fetchone()[0]
        return not busy
