"""Stored records' storage: an index of the RecordsPut events' records.

- `session_record`: one row per record of every active RecordsPut event (its
  sequence and position in the event), with what reads filter and answer on:
  kind, namespace, key, parent key, metadata, labels and the payload's size. The
  payload itself stays in the log row, read by sequence (`payloads`), so the bytes
  are stored once. A key put again has a row per put; reads take its newest
  (`queries.LATEST`). A rewind deletes the rows of the events it abandons, a checkout
  indexes the events it restores again (`FrameworkProjection.moved`).
- `session_record_label`: each row's labels, for indexed label filters.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import peewee

from session_service import storage_format
from session_service.records import RecordsPut, StoredRecord
from session_service.storage import queries
from switchboard.database import Backend, bind_model


class RecordRow(peewee.Model):
    seq = peewee.BigIntegerField()
    position = peewee.IntegerField()
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128)
    kind = peewee.CharField(max_length=64)
    namespace = peewee.CharField(max_length=512)
    key = peewee.CharField(max_length=512)
    parent_key = peewee.CharField(max_length=512)
    metadata = peewee.TextField()
    labels = peewee.TextField()  # JSON object, as answered (the label rows filter)
    payload_size = peewee.BigIntegerField()

    class Meta:
        table_name = "session_record"
        primary_key = peewee.CompositeKey("seq", "position")
        indexes = (
            (("session_id", "kind", "namespace", "key", "seq"), False),
            (("session_id", "kind", "namespace", "seq"), False),
            (("session_id", "kind", "seq"), False),
            (("session_id", "kind", "namespace", "parent_key", "seq"), False),
            (("agent", "kind", "seq"), False),
        )


class RecordLabelRow(peewee.Model):
    seq = peewee.BigIntegerField()
    position = peewee.IntegerField()
    name = peewee.CharField(max_length=64)
    value = peewee.CharField(max_length=256)
    agent = peewee.CharField(max_length=64)
    session_id = peewee.CharField(max_length=128)
    kind = peewee.CharField(max_length=64)

    class Meta:
        table_name = "session_record_label"
        primary_key = peewee.CompositeKey("seq", "position", "name")
        indexes = (
            (("agent", "kind", "name", "value"), False),
            (("session_id", "kind", "name", "value"), False),
        )


_COLUMNS = (
    "seq", "position", "agent", "session_id", "kind", "namespace", "key", "parent_key",
    "metadata", "labels", "payload_size",
)  # fmt: skip


@dataclass(frozen=True)
class IndexedRecord:
    """A record's index row: everything but the payload."""

    seq: int
    position: int
    agent: str
    session_id: str
    kind: str
    namespace: str
    key: str
    parent_key: str
    metadata: str
    labels: dict[str, str]
    payload_size: int

    @property
    def place(self) -> tuple[int, int]:
        return self.seq, self.position

    def answer(self, payload: bytes = b"") -> StoredRecord:
        return StoredRecord(
            kind=self.kind,
            namespace=self.namespace,
            key=self.key,
            parent_key=self.parent_key,
            metadata=self.metadata,
            payload=payload,
            labels=dict(self.labels),
            session_id=self.session_id,
            sequence=self.seq,
            payload_size=self.payload_size,
        )


def _indexed(row: Sequence[Any]) -> IndexedRecord:
    fields = dict(zip(_COLUMNS, row, strict=True))
    return IndexedRecord(
        **{
            **fields,
            "seq": int(fields["seq"]),
            "position": int(fields["position"]),
            "labels": json.loads(fields["labels"]),
            "payload_size": int(fields["payload_size"]),
        }
    )


@dataclass(frozen=True)
class RecordQuery:
    """A listing's filters (see ListRecordsRequest)."""

    agent: str
    session_id: str
    kind: str
    namespace: str | None = None
    keys: tuple[str, ...] = ()
    parent_key: str | None = None
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()


class RecordsStore:
    def __init__(self, backend: Backend) -> None:
        self.database: Any = backend.database
        self._sql = backend.sql  # `?` placeholders, in the backend's dialect
        self.Record = bind_model(RecordRow, self.database)
        self.Label = bind_model(RecordLabelRow, self.database)
        self.models = (self.Record, self.Label)
        self._insert = self._sql(queries.insert_record(_COLUMNS))
        self._insert_label = self._sql(queries.INSERT_RECORD_LABEL)

    def _rows(self, sql: str, params: Sequence[Any]) -> list[IndexedRecord]:
        return [_indexed(row) for row in self.database.execute_sql(self._sql(sql), params)]

    # -- indexing ---------------------------------------------------------------------------

    def index(self, seq: int, agent: str, session_id: str, put: RecordsPut) -> None:
        """Indexes a logged RecordsPut (erased placeholders are left out)."""
        for position, record in enumerate(put.records):
            if record.erased:
                continue
            self.database.execute_sql(
                self._insert,
                [
                    seq, position, agent, session_id, record.kind, record.namespace,
                    record.key, record.parent_key, record.metadata,
                    json.dumps(record.labels, sort_keys=True), len(record.payload),
                ],
            )  # fmt: skip
            for name, value in record.labels.items():
                self.database.execute_sql(
                    self._insert_label,
                    [seq, position, name, value, agent, session_id, record.kind],
                )

    def drop_between(self, first: int, last: int) -> None:
        """The rows of the events in [first, last] (a rewind abandoned them)."""
        for sql in queries.DROP_RECORDS_BETWEEN:
            self.database.execute_sql(self._sql(sql), [first, last])

    def drop(self, places: Iterable[tuple[int, int]]) -> None:
        for seq, position in places:
            for sql in queries.DROP_RECORD:
                self.database.execute_sql(self._sql(sql), [seq, position])

    def drop_session(self, session_id: str) -> None:
        for sql in queries.DROP_RECORDS_OF_SESSION:
            self.database.execute_sql(self._sql(sql), [session_id])

    def clear(self) -> None:
        for sql in queries.DROP_RECORDS:
            self.database.execute_sql(sql)

    def rows(self) -> set[tuple[Any, ...]]:
        return {
            tuple(row)
            for row in self.database.execute_sql(queries.record_rows(_COLUMNS)).fetchall()
        }

    # -- reads ------------------------------------------------------------------------------

    def latest(self, session_id: str, kind: str, namespace: str, key: str) -> IndexedRecord | None:
        """A key's newest put, or (key "") the newest put of the namespace."""
        where = "r.session_id = ? AND r.kind = ? AND r.namespace = ?"
        params: list[Any] = [session_id, kind, namespace]
        if key:
            where += " AND r.key = ?"
            params.append(key)
        found = self._rows(queries.newest_record(_COLUMNS, where), params)
        return found[0] if found else None

    def latest_in_any_namespace(self, session_id: str, kind: str, key: str) -> IndexedRecord | None:
        found = self._rows(
            queries.newest_record(_COLUMNS, "r.session_id = ? AND r.kind = ? AND r.key = ?"),
            [session_id, kind, key],
        )
        return found[0] if found else None

    def page(
        self,
        query: RecordQuery,
        below: tuple[int, int] | None,
        limit: int,
    ) -> list[IndexedRecord]:
        """Up to `limit` newest records (each key's newest put) below the place
        `below`, newest first: one statement."""
        where, params = self._where(query)
        if below is not None:
            where.append(queries.RECORDS_BELOW)
            params += [below[0], below[0], below[1]]
        return self._rows(queries.records_page(_COLUMNS, " AND ".join(where), limit), params)

    def _where(self, query: RecordQuery) -> tuple[list[str], list[Any]]:
        where, params = ["r.kind = ?", queries.LATEST], [query.kind]
        if query.session_id:
            where.append("r.session_id = ?")
            params.append(query.session_id)
        else:
            where.append("r.agent = ?")
            params.append(query.agent)
        if query.namespace is not None:
            where.append("r.namespace = ?")
            params.append(query.namespace)
        if query.parent_key is not None:
            where.append("r.parent_key = ?")
            params.append(query.parent_key)
        if query.keys:
            where.append(queries.keys_in(len(query.keys)))
            params += list(query.keys)
        for name, values in query.labels:
            where.append(queries.record_labelled(len(values)))
            params += [name, *values]
        return where, params

    def all_latest(self, query: RecordQuery) -> list[IndexedRecord]:
        """Every record (each key's newest put) the query matches, newest first."""
        found: list[IndexedRecord] = []
        place: tuple[int, int] | None = None
        while True:
            batch = self.page(query, place, 1000)
            found += batch
            if len(batch) < 1000:
                return found
            place = batch[-1].place

    def child_keys(
        self, session_id: str, kind: str, namespace: str, parent_keys: Iterable[str]
    ) -> set[str]:
        """The keys of `kind` records (any put) whose parent_key is one of `parent_keys`."""
        wanted = sorted(set(parent_keys))
        found: set[str] = set()
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            rows = self.database.execute_sql(
                self._sql(queries.child_keys(len(chunk))),
                [session_id, kind, namespace, *chunk],
            ).fetchall()
            found |= {str(key) for (key,) in rows}
        return found

    def every_put_of(
        self, session_id: str, kind: str, namespace: str | None, keys: Iterable[str]
    ) -> list[IndexedRecord]:
        """Every indexed put of the keys (older ones too), for erasing them."""
        wanted = sorted(set(keys))
        found: list[IndexedRecord] = []
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            where = "r.session_id = ? AND r.kind = ?"
            params: list[Any] = [session_id, kind]
            if namespace is not None:
                where += " AND r.namespace = ?"
                params.append(namespace)
            where += " AND " + queries.keys_in(len(chunk))
            found += self._rows(queries.records_where(_COLUMNS, where), params + chunk)
        return found

    def payloads(self, places: Iterable[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """The payloads of records by (sequence, position), read from their log rows:
        one statement, each row decoded once."""
        by_seq: dict[int, list[int]] = {}
        for seq, position in places:
            by_seq.setdefault(seq, []).append(position)
        if not by_seq:
            return {}
        seqs = sorted(by_seq)
        rows = self.database.execute_sql(
            self._sql(queries.log_rows(len(seqs))),
            seqs,
        ).fetchall()
        found: dict[tuple[int, int], bytes] = {}
        for seq, fmt, payload in rows:
            body = storage_format.decode_event(int(fmt), payload).body
            assert isinstance(body, RecordsPut), f"log row {seq} holds no records"
            for position in by_seq[int(seq)]:
                found[(int(seq), position)] = body.records[position].payload
        return found
