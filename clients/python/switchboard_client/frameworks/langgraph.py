"""LangGraph's checkpointer on Switchboard: `SwitchboardSaver`, a drop-in for
`SqliteSaver` / `PostgresSaver` (`pip install "switchboard-client[langgraph]"`).

    saver = SwitchboardSaver(SessionClient("127.0.0.1:50051"))
    graph = builder.compile(checkpointer=saver)

Each thread is a Switchboard session of the saver's agent; checkpoints and pending
writes are stored records of it (see `_langgraph_records`), read through the service's
index (one call per `get_tuple`, whatever the thread's length). Puts never move the
session's version (LangGraph writes a step's tasks in parallel). `delete_thread` erases
the session, `prune` and `delete_for_runs` erase records: the content leaves the log for
good (no Switchboard rewind or checkout brings it back).

The async methods run the blocking ones on a worker thread (`asyncio.to_thread`), as
LangGraph's in-memory saver does: one code path, and the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

try:
    from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
except ImportError as missing:  # the extra is not installed: say which one
    raise ImportError(
        f"switchboard_client.frameworks.langgraph needs langgraph ({missing.name} is "
        "missing): pip install 'switchboard-client[langgraph]'"
    ) from missing

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.errors import SwitchboardError
from switchboard_client.frameworks import _langgraph_records as rec
from switchboard_client.session import SessionClient

__all__ = ["SwitchboardSaver"]

T = TypeVar("T")
#: Threads whose session id the saver remembers (a lookup saved per call).
_REMEMBERED_THREADS = 10_000
#: Checkpoints read per page of `list`, and whose writes come in one call.
_PAGE = 100
#: Keys per EraseRecords call (the service's bound).
_ERASE_KEYS = 1000
#: Payload bytes per PutRecords call when copying (under the service's default 8 MiB).
_COPY_CALL_BYTES = 4 * 1024 * 1024
_NONE: Any = object()
#: Pending writes by (session id, checkpoint id).
_WritesByCheckpoint = dict[tuple[str, str], list[pb.StoredRecord]]


@dataclass
class _ListFilters:
    namespace: str | None
    keys: list[str]
    before_key: str
    metadata: Mapping[str, Any]
    page_size: int


class SwitchboardSaver(BaseCheckpointSaver[str]):  # type: ignore[misc]
    """A LangGraph checkpoint saver whose threads are sessions of one Switchboard agent.

    `client`: a `SessionClient` (the caller's: `close()` leaves it open). `agent`: the
    agent the threads belong to, created on first write if missing. `serde`: LangGraph's
    serializer (default `JsonPlusSerializer`, as every LangGraph saver).
    """

    def __init__(
        self, client: SessionClient, *, agent: str = "langgraph", serde: Any = None
    ) -> None:
        super().__init__(serde=serde)
        self.client = client
        self.agent = agent
        self._sessions: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._agent_ready = False

    # -- sessions of threads ------------------------------------------------------------

    def _remember(self, thread_id: str, session_id: str) -> str:
        with self._lock:
            self._sessions[thread_id] = session_id
            self._sessions.move_to_end(thread_id)
            while len(self._sessions) > _REMEMBERED_THREADS:
                self._sessions.popitem(last=False)
        return session_id

    def _forget(self, thread_id: str) -> None:
        with self._lock:
            self._sessions.pop(thread_id, None)

    def _remembered(self, thread_id: str) -> str | None:
        with self._lock:
            return self._sessions.get(thread_id)

    def _ensure_agent(self) -> None:
        if self._agent_ready:
            return
        try:
            self.client.create_agent(self.agent)
        except SwitchboardError as exc:
            if exc.code != grpc.StatusCode.ALREADY_EXISTS:
                raise
        self._agent_ready = True

    def _session_for_write(self, thread_id: str) -> str:
        """The thread's session, opened on first write; a thread erased by
        `delete_thread` starts again (as with LangGraph's own savers)."""
        remembered = self._remembered(thread_id)
        if remembered is not None:
            return remembered
        self._ensure_agent()
        try:
            resolved = self.client.resolve(
                self.agent, transport=rec.TRANSPORT, conversation_id=thread_id, reopen_erased=True
            )
        except SwitchboardError as exc:
            raise _as_langgraph_error(exc) from exc
        return self._remember(thread_id, resolved.session.session_id)

    def _session_for_read(self, thread_id: str) -> str | None:
        """The thread's session, or None when it has none (never written, or erased)."""
        remembered = self._remembered(thread_id)
        if remembered is not None:
            return remembered
        try:
            resolved = self.client.resolve(
                self.agent, transport=rec.TRANSPORT, conversation_id=thread_id, lookup_only=True
            )
        except SwitchboardError as exc:
            if _absent(exc):
                return None
            raise _as_langgraph_error(exc) from exc
        return self._remember(thread_id, resolved.session.session_id)

    def _on_session(self, thread_id: str, call: Callable[[str], T], *, write: bool, absent: T) -> T:
        """`call(session_id)`; when the remembered session is gone (another process
        erased the thread), looks the thread up again once."""
        for attempt in range(2):
            session_id = (
                self._session_for_write(thread_id) if write else self._session_for_read(thread_id)
            )
            if session_id is None:
                return absent
            try:
                return call(session_id)
            except SwitchboardError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND or exc.reason == "RECORD_NOT_FOUND":
                    raise _as_langgraph_error(exc) from exc
                self._forget(thread_id)
                if attempt == 1:
                    if write:
                        raise _as_langgraph_error(exc) from exc
                    return absent
        return absent

    # -- writes -------------------------------------------------------------------------

    def put(
        self,
        config: Any,
        checkpoint: Any,
        metadata: Any,
        new_versions: Any,
    ) -> dict[str, Any]:
        """Stores a checkpoint (its whole state, like SqliteSaver); answers its config."""
        place = rec.place_of(config, what="put")
        record = rec.checkpoint_record(self.serde, config, place, checkpoint, metadata)

        def put(session_id: str) -> None:
            self.client.put_records(self.agent, session_id, [record])

        self._on_session(place.thread_id, put, write=True, absent=None)
        return rec.thread_config(place.thread_id, place.namespace, record.key)

    def put_writes(
        self,
        config: Any,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Stores a task's writes for a checkpoint; the same (task, index) again
        replaces, so a retried step never duplicates."""
        place = rec.place_of(config, what="put_writes")
        if place.checkpoint_id is None:
            raise KeyError(
                "checkpoint_id: put_writes needs config['configurable']['checkpoint_id'] "
                "(the checkpoint the writes belong to)"
            )
        if not writes:
            return
        records = rec.write_records(
            self.serde, place, place.checkpoint_id, writes, task_id, task_path
        )

        def put(session_id: str) -> None:
            self.client.put_records(self.agent, session_id, records)

        self._on_session(place.thread_id, put, write=True, absent=None)

    # -- reads --------------------------------------------------------------------------

    def get_tuple(self, config: Any) -> CheckpointTuple | None:
        """The checkpoint the config names (or its namespace's newest) with its pending
        writes, in one indexed read; None when there is none."""
        place = rec.place_of(config, what="get_tuple")

        def get(session_id: str) -> CheckpointTuple | None:
            try:
                found = self.client.get_record(
                    self.agent,
                    session_id,
                    rec.CHECKPOINT,
                    namespace=place.namespace,
                    key=place.checkpoint_id or "",
                    children_kind=rec.WRITES,
                )
            except SwitchboardError as exc:
                if exc.reason == "RECORD_NOT_FOUND":
                    return None
                if exc.reason == "ANSWER_TOO_LARGE":
                    return self._get_in_parts(session_id, place)
                raise
            return rec.checkpoint_tuple(self.serde, found.record, found.children)

        return self._on_session(place.thread_id, get, write=False, absent=None)

    def _get_in_parts(self, session_id: str, place: rec.Place) -> CheckpointTuple | None:
        """A checkpoint whose writes do not fit one answer: the record, then its writes
        page by page."""
        found = self.client.get_record(
            self.agent,
            session_id,
            rec.CHECKPOINT,
            namespace=place.namespace,
            key=place.checkpoint_id or "",
        )
        writes = self.client.list_records(
            self.agent,
            rec.WRITES,
            session_id=session_id,
            namespace=place.namespace,
            parent_key=found.record.key,
            include_payloads=True,
        )
        return rec.checkpoint_tuple(self.serde, found.record, writes)

    def list(
        self,
        config: Any,
        *,
        filter: dict[str, Any] | None = None,
        before: Any = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of a thread (and namespace, when the config names
        one), or of every thread with `config` None; `filter` matches metadata keys,
        `before` takes those put before a checkpoint, `limit` bounds the count."""
        if limit is not None and limit <= 0:
            return
        filters = _ListFilters(
            namespace=None,
            keys=[],
            before_key=str(before["configurable"]["checkpoint_id"]) if before else "",
            metadata=filter or {},
            page_size=min(limit or _PAGE, _PAGE),
        )
        if config is None:
            records = self._listed("", filters)
        else:
            place = rec.place_of(config, what="list")
            configurable = config["configurable"]
            if "checkpoint_ns" in configurable:
                filters.namespace = place.namespace
            filters.keys = [place.checkpoint_id] if place.checkpoint_id else []
            records = self._on_session(
                place.thread_id,
                lambda session_id: self._listed(session_id, filters),
                write=False,
                absent=iter(()),
            )
        for page in _pages(itertools.islice(records, limit), _PAGE):
            writes = self._writes_of(page)
            for record in page:
                yield rec.checkpoint_tuple(
                    self.serde, record, writes.get((record.session_id, record.key), [])
                )

    def _listed(self, session_id: str, filters: _ListFilters) -> Iterator[pb.StoredRecord]:
        """The matching checkpoints, the first page already read (so that a session
        erased meanwhile raises here, where `_on_session` looks the thread up again)."""

        def listing(before_key: str) -> Iterator[pb.StoredRecord]:
            return self.client.list_records(
                self.agent,
                rec.CHECKPOINT,
                session_id=session_id,
                namespace=filters.namespace,
                keys=filters.keys,
                before_key=before_key,
                metadata_filter=filters.metadata,
                include_payloads=True,
                page_size=filters.page_size,
            )

        records = listing(filters.before_key)
        try:
            first = next(records, None)
        except SwitchboardError as exc:
            if exc.reason == "AGENT_NOT_FOUND":
                return iter(())  # nothing was ever written
            if exc.reason != "RECORD_NOT_FOUND" or not filters.before_key:
                raise
            # `before` names a checkpoint not stored here: compare ids, as SQL savers do.
            return (r for r in listing("") if r.key < filters.before_key)
        return iter(()) if first is None else itertools.chain([first], records)

    def _writes_of(self, page: Sequence[pb.StoredRecord]) -> _WritesByCheckpoint:
        """The pending writes of a page of checkpoints, one call per session."""
        found: _WritesByCheckpoint = {}
        for session_id, group in itertools.groupby(
            sorted(page, key=lambda r: r.session_id), key=lambda r: r.session_id
        ):
            ids = sorted({record.key for record in group})
            for write in self.client.list_records(
                self.agent,
                rec.WRITES,
                session_id=session_id,
                labels={rec.CHECKPOINT_LABEL: ids},
                include_payloads=True,
                page_size=1000,
            ):
                found.setdefault((session_id, write.parent_key), []).append(write)
        return found

    # -- erasure and copies -------------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Erases the thread for good: its session's content leaves the log."""
        session_id = self._session_for_read(str(thread_id))
        self._forget(str(thread_id))
        if session_id is None:
            return
        try:
            self.client.erase_session(self.agent, session_id)
        except SwitchboardError as exc:
            if not _absent(exc):
                raise _as_langgraph_error(exc) from exc

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Erases the checkpoints (with their writes) of these runs, in every thread."""
        for chunk in _pages(sorted({str(run) for run in run_ids}), 100):
            self._erase(rec.CHECKPOINT, "", labels={rec.RUN_LABEL: chunk})

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint and write of a thread (the whole parent chain, as
        DeltaChannel needs) to another thread, in the order they were put."""
        source = self._session_for_read(str(source_thread_id))
        if source is None:
            return
        records = [
            rec.copied(record, str(target_thread_id))
            for kind in (rec.CHECKPOINT, rec.WRITES)
            for record in reversed(
                list(
                    self.client.list_records(
                        self.agent,
                        kind,
                        session_id=source,
                        include_payloads=True,
                        page_size=1000,
                    )
                )
            )
        ]
        for batch in _batches_by_bytes(records, _COPY_CALL_BYTES):

            def put(session_id: str, batch: Sequence[pb.StoredRecord] = batch) -> None:
                self.client.put_records(self.agent, session_id, batch)

            self._on_session(str(target_thread_id), put, write=True, absent=None)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """`keep_latest`: each namespace keeps its newest checkpoint, and for a graph
        with DeltaChannels also the ancestors (with their writes) back to each delta
        channel's snapshot, so nothing kept reconstructs as empty. `delete`: erases
        every checkpoint. What is pruned is erased for good."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            session_id = self._session_for_read(str(thread_id))
            if session_id is None:
                continue
            if strategy == "delete":
                self._erase(rec.CHECKPOINT, session_id, all_records=True)
                self._erase(rec.WRITES, session_id, all_records=True)
            else:
                self._keep_latest(session_id)

    def _keep_latest(self, session_id: str) -> None:
        listed = list(
            self.client.list_records(
                self.agent, rec.CHECKPOINT, session_id=session_id, page_size=1000
            )
        )
        newest: dict[str, pb.StoredRecord] = {}
        for record in listed:
            newest.setdefault(record.namespace, record)
        if not any(rec.delta_channels(record) for record in newest.values()):
            self._erase(rec.CHECKPOINT, session_id, keep_newest_per_namespace=1)
            return
        keep = set()
        for record in newest.values():
            keep |= self._delta_chain(session_id, record)
        doomed = [r for r in listed if (r.namespace, r.key) not in keep]
        for namespace, group in itertools.groupby(
            sorted(doomed, key=lambda r: r.namespace), key=lambda r: r.namespace
        ):
            for keys in _pages([r.key for r in group], _ERASE_KEYS):
                self._erase(rec.CHECKPOINT, session_id, namespace=namespace, keys=keys)

    def _delta_chain(self, session_id: str, newest: pb.StoredRecord) -> set[tuple[str, str]]:
        """The newest checkpoint and its ancestors back to where every delta channel's
        value is stored (a snapshot), as (namespace, key)."""
        waiting = rec.delta_channels(newest)
        chain = {(newest.namespace, newest.key)}
        parent = newest.parent_key
        while waiting and parent:
            ancestor = self.client.get_record(
                self.agent, session_id, rec.CHECKPOINT, namespace=newest.namespace, key=parent
            ).record
            chain.add((ancestor.namespace, ancestor.key))
            waiting -= rec.stored_channels(self.serde, ancestor)
            parent = ancestor.parent_key
        return chain

    def _erase(self, kind: str, session_id: str, **selection: Any) -> None:
        try:
            self.client.erase_records(
                self.agent,
                kind,
                session_id=session_id,
                children_kind=rec.WRITES if kind == rec.CHECKPOINT else "",
                **selection,
            )
        except SwitchboardError as exc:
            if not _absent(exc):
                raise _as_langgraph_error(exc) from exc

    def get_delta_channel_history(
        self, *, config: Any, channels: Sequence[str]
    ) -> dict[str, dict[str, Any]]:
        """DeltaChannel's walk up the target's parent chain (beta in LangGraph), a page
        of ancestors per call and their writes in one more, where the default reads one
        ancestor per call."""
        if not channels:
            return {}
        walk = rec.DeltaWalk(self.serde, channels)
        target = self.get_tuple(config)
        if target is not None and target.parent_config is not None:
            place = rec.place_of(target.config, what="get_delta_channel_history")
            parent = str(target.parent_config["configurable"]["checkpoint_id"])

            def walk_up(session_id: str) -> None:
                self._walk_ancestors(session_id, place, parent, walk)

            self._on_session(place.thread_id, walk_up, write=False, absent=None)
        return walk.result()

    def _walk_ancestors(
        self, session_id: str, target: rec.Place, parent: str, walk: rec.DeltaWalk
    ) -> None:
        """Checkpoints put before the target, newest first (a parent is always put
        before its child); those on its parent chain go to `walk`, other branches' are
        passed over."""
        earlier = self.client.list_records(
            self.agent,
            rec.CHECKPOINT,
            session_id=session_id,
            namespace=target.namespace,
            before_key=target.checkpoint_id or "",
            include_payloads=True,
            page_size=_PAGE,
        )
        wanted = parent
        for page in _pages(earlier, _PAGE):
            on_path = []
            for record in page:
                if record.key == wanted:
                    on_path.append(record)
                    wanted = record.parent_key
            writes = self._writes_of(on_path) if on_path else {}
            for record in on_path:
                if not walk.visit(record, writes.get((session_id, record.key), [])):
                    return
            if not wanted:
                return

    def get_next_version(self, current: str | None, channel: None) -> str:
        return rec.next_version(current)

    # -- async: the same calls on a worker thread ---------------------------------------

    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: Any,
        *,
        filter: dict[str, Any] | None = None,
        before: Any = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        listed = self.list(config, filter=filter, before=before, limit=limit)
        while (item := await asyncio.to_thread(next, listed, _NONE)) is not _NONE:
            yield item

    async def aget_delta_channel_history(
        self, *, config: Any, channels: Sequence[str]
    ) -> dict[str, dict[str, Any]]:
        return await asyncio.to_thread(
            self.get_delta_channel_history, config=config, channels=channels
        )

    async def aput(
        self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any
    ) -> dict[str, Any]:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


def _absent(exc: SwitchboardError) -> bool:
    """The thread has no session: never made, or erased."""
    return exc.code == grpc.StatusCode.NOT_FOUND or exc.reason == "SESSION_ERASED"


def _as_langgraph_error(exc: SwitchboardError) -> Exception:
    """A refusal as LangGraph's savers raise it: bad input is a ValueError naming what
    to change; anything else stays a SwitchboardError."""
    if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
        return ValueError(f"Switchboard refused the checkpoint data: {exc.message}")
    return exc


def _pages(items: Any, size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while page := list(itertools.islice(iterator, size)):
        yield page


def _batches_by_bytes(
    records: Sequence[pb.StoredRecord], max_bytes: int
) -> Iterator[list[pb.StoredRecord]]:
    batch: list[pb.StoredRecord] = []
    size = 0
    for record in records:
        if batch and (size + len(record.payload) > max_bytes or len(batch) == 1000):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += len(record.payload)
    if batch:
        yield batch
