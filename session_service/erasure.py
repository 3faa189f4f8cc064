"""Erasure, decided once: EraseSession (Google ADK `delete_session`, LangGraph
`delete_thread`) and EraseRecords (LangGraph `delete_for_runs`, `prune`).

Erased content is gone from the database, not hidden: the log rows that held it
are rewritten in place (an erased session's rows become tombstones; a RecordsPut
row keeps its place and its other records, the erased ones as empty
placeholders), snapshots and projections of it are deleted, and so are the
remembered answers of request ids that carry it. Abandoned branches are erased
too, so no checkout can restore what was erased; tombstones fold to nothing and
are never moved, so no rewind can either. Afterwards SQLite's write-ahead log is
checkpointed and truncated (the session database runs with secure_delete, so
freed pages hold zeros). On Postgres the rows are updated and deleted; the old
row versions stay in the table files as dead tuples until VACUUM reuses them.

One Erasure event records each erasure (who, what, how much), never abandoned.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from session_service.checks import agent_name, checked_session_id
from session_service.core import Core
from session_service.records import Erasure, Event, RecordsPut, StoredRecord
from session_service.storage.erasure_store import ErasureStore
from session_service.storage.event_log import session_entity
from session_service.storage.records_store import IndexedRecord, RecordQuery
from session_service.storage.state_store import session_owner
from session_service.stored_records import checked_kind, checked_label_filters, checked_name
from switchboard.errors import InvalidArgument, NotFound
from switchboard.idempotency import SESSION_REQUESTS, RequestGuard

MAX_ERASED_KEYS = 1000
#: How often a WAL checkpoint that readers kept busy is tried again.
CHECKPOINT_ATTEMPTS = 20


@dataclass(frozen=True)
class RecordSelection:
    """Which records EraseRecords erases: exactly one of keys, labels, all and
    keep_newest, within a kind (and namespace); with children of children_kind."""

    kind: str
    namespace: str | None = None
    keys: tuple[str, ...] = ()
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    all: bool = False
    keep_newest: int | None = None
    children_kind: str = ""

    def check(self, session_id: str) -> None:
        checked_kind("kind", self.kind)
        if self.namespace is not None:
            checked_name("namespace", self.namespace, required=False)
        if self.children_kind:
            checked_kind("children_kind", self.children_kind)
        chosen = [bool(self.keys), bool(self.labels), self.all, self.keep_newest is not None]
        if sum(chosen) != 1:
            raise InvalidArgument(
                "keys", "give exactly one of keys, labels, all and keep_newest_per_namespace"
            )
        if len(self.keys) > MAX_ERASED_KEYS:
            raise InvalidArgument("keys", f"give at most {MAX_ERASED_KEYS} keys")
        for number, key in enumerate(self.keys):
            checked_name(f"keys[{number}]", key, required=True)
        checked_label_filters("labels", self.labels)
        if not session_id and not self.labels:
            raise InvalidArgument(
                "session_id", "is required, except to erase by labels across the agent's sessions"
            )

    def matches(self, record: StoredRecord, kept: set[str]) -> bool:
        """Whether an abandoned put of the kind is selected (`kept`: keep_newest's keys)."""
        if record.kind != self.kind or (
            self.namespace is not None and record.namespace != self.namespace
        ):
            return False
        if self.keys:
            return record.key in self.keys
        if self.labels:
            return all(record.labels.get(name) in values for name, values in self.labels)
        return self.all or record.key not in kept


@dataclass
class _Erasing:
    """What one EraseRecords erases, gathered before anything is rewritten."""

    #: (session, namespace) -> the keys erased there (parents of erased children).
    keys: dict[tuple[str, str], set[str]] = field(default_factory=dict)
    #: Log row -> (its session, the positions of its records to erase).
    rows: dict[int, set[int]] = field(default_factory=dict)
    indexed: set[tuple[int, int]] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)

    def add_indexed(self, rows: Iterable[IndexedRecord]) -> None:
        for row in rows:
            self.rows.setdefault(row.seq, set()).add(row.position)
            self.indexed.add(row.place)
            self.sessions.add(row.session_id)

    def add_logged(self, seq: int, position: int, session_id: str) -> None:
        self.rows.setdefault(seq, set()).add(position)
        self.sessions.add(session_id)


class Erasures:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.store = core.store
        self.erased = ErasureStore(core.store.backend, core.redactor)
        self.framework = core.projection.framework
        self.records = core.projection.framework.records

    async def erase_session(
        self, agent: str, session_id: str, principal: str, *, guard: RequestGuard | None = None
    ) -> tuple[Event, int]:
        """(the Erasure event, how many log rows became tombstones)."""
        agent_name("agent", agent)
        checked_session_id(session_id)

        def op(now: float) -> tuple[Event, int]:
            index = self.core.session_of(agent, session_id)
            routing_key = self.core.summary(session_id, index).routing_key
            self._keep_version_floor(session_id)
            seqs = [seq for seq, _ in self.erased.session_rows(session_id)]
            count = self.erased.tombstone_rows(agent, session_id, seqs)
            self.erased.drop_session_rows(session_id)
            self.framework.forget_session(session_id, session_owner(session_id))
            self.erased.drop_answers_naming(session_id, SESSION_REQUESTS)
            body = Erasure(
                agent=agent,
                session_id=session_id,
                whole_session=True,
                erased_events=count,
                principal=principal,
            )
            [record] = self.core.record(now, [Event(body=body)])
            self.erased.remember(agent, session_id, routing_key, record.sequence)
            return record, count

        result: tuple[Event, int] = await self.core.write(op, guard=guard)
        await self._checkpoint()
        return result

    def _keep_version_floor(self, session_id: str) -> None:
        """A session created again under the erased id (reopen_erased) must start
        above every version the erased one had: its rows no longer say them."""
        entity = session_entity(session_id)
        version = self.store.markers.highest_version(entity)
        floor = self.store.tables.VersionFloor
        floor.insert(entity=entity, version=version).on_conflict(
            conflict_target=[floor.entity], update={floor.version: version}
        ).execute()

    async def erase_records(
        self,
        agent: str,
        session_id: str,
        selection: RecordSelection,
        principal: str,
        *,
        guard: RequestGuard | None = None,
    ) -> tuple[Event | None, int, list[str]]:
        """(the Erasure event or None when nothing matched, records erased, sessions)."""
        agent_name("agent", agent)
        if session_id:
            checked_session_id(session_id)
        selection.check(session_id)

        def op(now: float) -> tuple[Event | None, int, list[str]]:
            if session_id:
                self.core.session_of(agent, session_id)
            elif self.store.projections.agent_index(agent) is None:
                raise NotFound("AGENT_NOT_FOUND", f"agent {agent!r} does not exist")
            erasing = self._gather(agent, session_id, selection)
            if not erasing.rows:
                return None, 0, []
            self._rewrite(erasing.rows)
            self.records.drop(erasing.indexed)
            erased = sum(len(positions) for positions in erasing.rows.values())
            body = Erasure(
                agent=agent,
                session_id=session_id,
                record_kind=selection.kind,
                erased_events=len(erasing.rows),
                erased_records=erased,
                principal=principal,
            )
            [record] = self.core.record(now, [Event(body=body)])
            return record, erased, sorted(erasing.sessions)

        result: tuple[Event | None, int, list[str]] = await self.core.write(op, guard=guard)
        if result[0] is not None:
            await self._checkpoint()
        return result

    def _gather(self, agent: str, session_id: str, selection: RecordSelection) -> _Erasing:
        erasing = _Erasing()
        kept: dict[tuple[str, str], set[str]] = {}
        query = RecordQuery(
            agent=agent,
            session_id=session_id,
            kind=selection.kind,
            namespace=selection.namespace,
            keys=selection.keys,
            labels=selection.labels,
        )
        for row in self.records.all_latest(query):  # newest first
            place = (row.session_id, row.namespace)
            if selection.keep_newest is not None:
                held = kept.setdefault(place, set())
                if len(held) < selection.keep_newest:
                    held.add(row.key)
                    continue
            erasing.keys.setdefault(place, set()).add(row.key)
        for (sid, namespace), keys in erasing.keys.items():
            erasing.add_indexed(self.records.every_put_of(sid, selection.kind, namespace, keys))
        self._gather_abandoned(agent, session_id, selection, kept, erasing)
        if selection.children_kind:
            self._gather_children(agent, session_id, selection.children_kind, erasing)
        return erasing

    def _gather_abandoned(
        self,
        agent: str,
        session_id: str,
        selection: RecordSelection,
        kept: dict[tuple[str, str], set[str]],
        erasing: _Erasing,
    ) -> None:
        """Puts a rewind abandoned: not indexed, but a checkout would restore them."""
        for seq, event in self.erased.abandoned_puts(agent, session_id):
            assert isinstance(event.body, RecordsPut)
            for position, record in enumerate(event.body.records):
                place = (event.session_id, record.namespace)
                if not record.erased and selection.matches(record, kept.get(place, set())):
                    erasing.add_logged(seq, position, event.session_id)
                    erasing.keys.setdefault(place, set()).add(record.key)

    def _gather_children(self, agent: str, session_id: str, kind: str, erasing: _Erasing) -> None:
        for (sid, namespace), parents in list(erasing.keys.items()):
            children = self.records.child_keys(sid, kind, namespace, parents)
            erasing.add_indexed(self.records.every_put_of(sid, kind, namespace, children))
        for seq, event in self.erased.abandoned_puts(agent, session_id):
            assert isinstance(event.body, RecordsPut)
            for position, record in enumerate(event.body.records):
                parents = erasing.keys.get((event.session_id, record.namespace), set())
                if not record.erased and record.kind == kind and record.parent_key in parents:
                    erasing.add_logged(seq, position, event.session_id)

    def _rewrite(self, rows: dict[int, set[int]]) -> None:
        """Each log row re-encoded with its erased records as empty placeholders."""
        seqs = sorted(rows)
        for start in range(0, len(seqs), 200):
            for seq, event in self.erased.log_rows(seqs[start : start + 200]):
                assert isinstance(event.body, RecordsPut)
                for position in rows[seq]:
                    event.body.records[position] = StoredRecord(erased=True)
                self.erased.rewrite_row(seq, event)

    async def _checkpoint(self) -> None:
        """SQLite: empties the write-ahead log of the erased pages' copies."""
        for _ in range(CHECKPOINT_ATTEMPTS):
            if await self.core.runner.read(self.erased.checkpoint_wal):
                return
            await asyncio.sleep(0.05)
