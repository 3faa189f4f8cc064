"""Stored records: opaque payloads an agent framework keeps in a session (LangGraph
checkpoints and their pending writes), written as one RecordsPut event per call and
read through an index (`records_store`) by kind, namespace and key; never by
replaying the log. Unversioned puts keep the session's version (LangGraph writes
from parallel tasks); a versioned put is a turn change like an append.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import Event, RecordsPut, StoredRecord
from session_service.scoped_state import refuse_stale
from session_service.storage.records_store import IndexedRecord, RecordQuery
from switchboard import pagination, validation
from switchboard.errors import FailedPrecondition, InvalidArgument, NotFound
from switchboard.idempotency import RequestGuard

MAX_RECORDS_PER_CALL = 1000
MAX_KEY_CHARS = 512
MAX_METADATA_BYTES = 64 * 1024
MAX_LABELS = 16
MAX_LABEL_FILTERS = 8
MAX_LABEL_VALUES = 100
MAX_LISTED_KEYS = 1000
MAX_METADATA_FILTERS = 16
#: Candidate rows a page with a metadata filter reads at most (then it ends early).
MAX_SCANNED = 10_000
MAX_CHILDREN = 10_000
_KIND = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
_LABEL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def checked_kind(field: str, kind: str) -> str:
    if not _KIND.fullmatch(kind):
        raise InvalidArgument(
            field,
            f"{kind[:70]!r} is not a record kind: 1-64 lower-case letters, digits, '_', '-' "
            "or '.', e.g. 'checkpoint'",
        )
    return kind


def checked_name(field: str, value: str, *, required: bool) -> str:
    """A namespace, key or parent key: printable, at most 512 characters."""
    validation.text(field, value, max_len=MAX_KEY_CHARS, required=required)
    if not value.isprintable():
        raise InvalidArgument(field, "must be printable (no control or format characters)")
    return value


def checked_label_filters(field: str, filters: Sequence[tuple[str, Sequence[str]]]) -> None:
    if len(filters) > MAX_LABEL_FILTERS:
        raise InvalidArgument(field, f"give at most {MAX_LABEL_FILTERS} label filters")
    for number, (name, values) in enumerate(filters):
        _checked_label_name(f"{field}[{number}].name", name)
        if not values or len(values) > MAX_LABEL_VALUES:
            raise InvalidArgument(
                f"{field}[{number}].values", f"give 1 to {MAX_LABEL_VALUES} values"
            )
        for value in values:
            validation.text(f"{field}[{number}].values", value, max_len=256)


def _checked_label_name(field: str, name: str) -> None:
    if not _LABEL_NAME.fullmatch(name):
        raise InvalidArgument(field, "must be 1-64 letters, digits, '_', '-' or '.'")


def _checked_record(field: str, record: StoredRecord, max_bytes: int) -> StoredRecord:
    checked_kind(f"{field}.kind", record.kind)
    checked_name(f"{field}.namespace", record.namespace, required=False)
    checked_name(f"{field}.key", record.key, required=True)
    checked_name(f"{field}.parent_key", record.parent_key, required=False)
    if record.erased or record.session_id or record.sequence or record.payload_size:
        raise InvalidArgument(
            field,
            "erased, session_id, sequence and payload_size are set by the service: "
            "leave them unset",
        )
    if record.metadata:
        if len(record.metadata.encode()) > MAX_METADATA_BYTES:
            raise InvalidArgument(f"{field}.metadata", f"is over {MAX_METADATA_BYTES} bytes")
        try:
            metadata = json.loads(record.metadata)
        except ValueError as error:
            raise InvalidArgument(f"{field}.metadata", f"is not JSON text ({error})") from None
        if not isinstance(metadata, dict):
            raise InvalidArgument(f"{field}.metadata", "must be a JSON object")
    if len(record.payload) > max_bytes:
        raise InvalidArgument(
            f"{field}.payload",
            f"is {len(record.payload)} bytes; this server accepts at most {max_bytes} per "
            "record (--max-record-bytes)",
            reason="RECORD_TOO_LARGE",
        )
    if len(record.labels) > MAX_LABELS:
        raise InvalidArgument(f"{field}.labels", f"give at most {MAX_LABELS} labels")
    for name, value in record.labels.items():
        _checked_label_name(f"{field}.labels[{name[:40]!r}]", name)
        validation.text(f"{field}.labels[{name[:40]!r}]", value, max_len=256)
    return replace(record)


@dataclass(frozen=True)
class ListRequest:
    """ListRecords' filters and paging, as received."""

    query: RecordQuery
    before_key: str = ""
    metadata_filter: tuple[tuple[str, str], ...] = ()
    include_payloads: bool = False
    page_size: int = 0
    page_token: str = ""


def _checked_metadata_filter(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    if len(pairs) > MAX_METADATA_FILTERS:
        raise InvalidArgument("metadata_filter", f"give at most {MAX_METADATA_FILTERS} entries")
    wanted: dict[str, Any] = {}
    for key, value in pairs:
        try:
            wanted[key] = json.loads(value)
        except ValueError as error:
            raise InvalidArgument(
                f"metadata_filter[{key[:40]!r}]", f"is not JSON text ({error})"
            ) from None
    return wanted


def _matches(metadata: str, wanted: dict[str, Any]) -> bool:
    if not wanted:
        return True
    found = json.loads(metadata) if metadata else {}
    missing = object()
    return all(found.get(key, missing) == value for key, value in wanted.items())


class StoredRecords:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.index = core.projection.framework.records
        self.runner = core.runner

    async def put(
        self,
        agent: str,
        session_id: str,
        records: Sequence[StoredRecord],
        versioned: bool,
        expected_version: int | None,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[int, int, str]:
        """(the RecordsPut event's sequence, the session's version after it, the session)."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        if not records or len(records) > MAX_RECORDS_PER_CALL:
            raise InvalidArgument("records", f"give 1 to {MAX_RECORDS_PER_CALL} records")
        if expected_version is not None and not versioned:
            raise InvalidArgument(
                "expected_version",
                "goes with versioned puts only: set versioned, or leave it unset",
            )
        limits = self.core.limits
        checked = [
            _checked_record(f"records[{n}]", r, limits.max_record_bytes)
            for n, r in enumerate(records)
        ]
        total = sum(len(record.payload) for record in checked)
        if total > limits.max_records_call_bytes:
            raise InvalidArgument(
                "records",
                f"carry {total} bytes of payload; this server accepts at most "
                f"{limits.max_records_call_bytes} per call (--max-records-call-bytes): split it",
                reason="RECORDS_CALL_TOO_LARGE",
            )

        def op(now: float) -> tuple[int, int, str]:
            index = self.core.open_session_of(agent, session_id)
            if versioned:
                refuse_stale(index, expected_version)
            version = index.version + 1 if versioned else index.version
            event = Event(
                agent=agent,
                session_id=session_id,
                session_version=version,
                body=RecordsPut(records=checked),
            )
            [logged] = self.core.log(now, [event], index)
            return logged.sequence, version, session_id

        result: tuple[int, int, str] = await self.core.write(op, guard=guard)
        return result

    async def get(
        self, agent: str, session_id: str, kind: str, namespace: str, key: str, children_kind: str
    ) -> tuple[StoredRecord, list[StoredRecord]]:
        """(the record with its payload, its children with theirs)."""
        agent_name("agent", agent)
        checked_session_id(session_id)
        checked_kind("kind", kind)
        checked_name("namespace", namespace, required=False)
        checked_name("key", key, required=False)
        if children_kind:
            checked_kind("children_kind", children_kind)

        def op() -> tuple[StoredRecord, list[StoredRecord]]:
            self.core.session_of(agent, session_id)
            found = self.index.latest(session_id, kind, namespace, key)
            if found is None:
                what = f"key {key!r}" if key else "any record"
                raise NotFound(
                    "RECORD_NOT_FOUND",
                    f"session {session_id!r} has no {kind!r} record with {what} in namespace "
                    f"{namespace!r}",
                )
            children: list[IndexedRecord] = []
            if children_kind:
                children = self._children(session_id, children_kind, namespace, found.key)
            payloads = self.index.payloads([found.place, *(c.place for c in children)])
            if sum(len(p) for p in payloads.values()) > pagination.MAX_ANSWER_BYTES:
                raise FailedPrecondition(
                    "ANSWER_TOO_LARGE",
                    f"the record and its {len(children)} children would not fit one answer: "
                    "read the children with ListRecords",
                )
            return found.answer(payloads[found.place]), [
                child.answer(payloads[child.place]) for child in children
            ]

        # The index rows, then the payloads their rows point to: as one state.
        result: tuple[StoredRecord, list[StoredRecord]] = await self.runner.read(
            op, consistent=True
        )
        return result

    def _children(
        self, session_id: str, kind: str, namespace: str, parent_key: str
    ) -> list[IndexedRecord]:
        query = RecordQuery(
            agent="", session_id=session_id, kind=kind, namespace=namespace, parent_key=parent_key
        )
        rows = self.index.page(query, None, MAX_CHILDREN + 1)
        if len(rows) > MAX_CHILDREN:
            raise FailedPrecondition(
                "ANSWER_TOO_LARGE",
                f"the record has more than {MAX_CHILDREN} children: read them with ListRecords",
            )
        return rows[::-1]  # oldest put first

    async def listing(self, request: ListRequest) -> tuple[list[StoredRecord], str]:
        query = request.query
        agent_name("agent", query.agent)
        if query.session_id:
            checked_session_id(query.session_id)
        checked_kind("kind", query.kind)
        for field, value in (("namespace", query.namespace), ("parent_key", query.parent_key)):
            if value is not None:
                checked_name(field, value, required=False)
        if len(query.keys) > MAX_LISTED_KEYS:
            raise InvalidArgument("keys", f"give at most {MAX_LISTED_KEYS} keys")
        for number, key in enumerate(query.keys):
            checked_name(f"keys[{number}]", key, required=True)
        checked_name("before_key", request.before_key, required=False)
        checked_label_filters("labels", query.labels)
        wanted = _checked_metadata_filter(request.metadata_filter)
        size = pagination.page_size(request.page_size)
        filters = [
            "records", query.agent, query.session_id, query.kind, query.namespace,
            sorted(query.keys), query.parent_key, request.before_key,
            [list(pair) for pair in query.labels], sorted(request.metadata_filter),
            request.include_payloads,
        ]  # fmt: skip
        position = pagination.position_of(request.page_token, filters, int, int)

        def op() -> tuple[list[StoredRecord], str]:
            self._check_owner(query)
            below = tuple(position) if position else self._before(query, request.before_key)
            rows, scanned_to = self._matching(query, below, size, wanted)
            more = len(rows) > size
            rows = rows[:size]
            if request.include_payloads:
                fit = pagination.fitting(row.payload_size for row in rows)
                more, scanned_to = more or fit < len(rows), None if fit < len(rows) else scanned_to
                rows = rows[:fit]
                payloads = self.index.payloads(row.place for row in rows)
                answers = [row.answer(payloads[row.place]) for row in rows]
            else:
                answers = [row.answer() for row in rows]
            # A page the scan bound ended goes on after the last row it read.
            edge = scanned_to if scanned_to is not None else rows[-1].place if more else None
            return answers, pagination.encode(list(edge), filters) if edge else ""

        result: tuple[list[StoredRecord], str] = await self.runner.read(op, consistent=True)
        return result

    def _check_owner(self, query: RecordQuery) -> None:
        if query.session_id:
            self.core.session_of(query.agent, query.session_id)
        elif self.core.store.projections.agent_index(query.agent) is None:
            raise NotFound("AGENT_NOT_FOUND", f"agent {query.agent!r} does not exist")

    def _before(self, query: RecordQuery, before_key: str) -> tuple[int, int] | None:
        if not before_key:
            return None
        if not query.session_id:
            raise InvalidArgument("before_key", "goes with a session_id")
        if query.namespace is not None:
            found = self.index.latest(query.session_id, query.kind, query.namespace, before_key)
        else:
            found = self.index.latest_in_any_namespace(query.session_id, query.kind, before_key)
        if found is None:
            raise NotFound(
                "RECORD_NOT_FOUND",
                f"before_key {before_key!r} names no {query.kind!r} record of the session",
            )
        return found.place

    def _matching(
        self,
        query: RecordQuery,
        below: tuple[int, ...] | None,
        size: int,
        wanted: dict[str, Any],
    ) -> tuple[list[IndexedRecord], tuple[int, int] | None]:
        """Up to size + 1 matching rows below `below`; and, when the scan bound ended
        the page early, the place of the last row scanned (where the next page goes on)."""
        place = None if below is None else (int(below[0]), int(below[1]))
        if not wanted:
            return self.index.page(query, place, size + 1), None
        matched: list[IndexedRecord] = []
        scanned = 0
        while len(matched) <= size:
            batch = self.index.page(query, place, 500)
            if not batch:
                return matched, None
            for row in batch:
                scanned += 1
                if _matches(row.metadata, wanted):
                    matched.append(row)
                    if len(matched) > size:
                        return matched, None
            place = batch[-1].place
            if scanned >= MAX_SCANNED:
                return matched, place
        return matched, None
