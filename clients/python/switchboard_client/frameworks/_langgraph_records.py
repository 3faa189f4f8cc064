"""How LangGraph checkpoints and pending writes are kept as Switchboard stored records,
and read back: the pure half of `switchboard_client.frameworks.langgraph` (no calls).

A thread is a session (transport "langgraph", conversation id = the thread id). A
checkpoint is a record of kind "checkpoint": namespace = checkpoint_ns, key =
checkpoint id, parent_key = the parent checkpoint's id, metadata = the checkpoint's
metadata as JSON (what `list(filter=...)` matches), labels = the thread id and the run
id (what `delete_for_runs` erases by). A pending write is a record of kind "writes"
whose parent_key is its checkpoint's id, labelled with that id too (so a page of
checkpoints gets its writes in one call). Payloads are the saver's serde output,
framed as `type NUL bytes`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    CheckpointTuple,
    get_checkpoint_metadata,
    writes_sort_key,
)

from switchboard.session.v1 import session_service_pb2 as pb

TRANSPORT = "langgraph"
CHECKPOINT = "checkpoint"
WRITES = "writes"
THREAD_LABEL = "thread_id"
RUN_LABEL = "run_id"
CHECKPOINT_LABEL = "checkpoint_id"
#: The service's bound on a label value (StoredRecord.labels).
MAX_LABEL_CHARS = 256
#: The metadata key of DeltaChannel's snapshot counters (langgraph-checkpoint 4.3).
DELTA_COUNTERS = "counters_since_delta_snapshot"

Config = Mapping[str, Any]


@dataclass(frozen=True)
class Place:
    """Where a config points: a thread, a namespace, maybe one checkpoint."""

    thread_id: str
    namespace: str
    checkpoint_id: str | None


def place_of(config: Config, *, what: str) -> Place:
    """The thread, namespace and checkpoint a config names; KeyError (as LangGraph's
    own savers raise) when it names no thread."""
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise KeyError(
            f"thread_id: {what} needs config['configurable']['thread_id'] "
            "(the conversation the checkpoint belongs to)"
        )
    return Place(
        thread_id=str(thread_id),
        namespace=str(configurable.get("checkpoint_ns", "")),
        checkpoint_id=configurable.get("checkpoint_id") or None,
    )


def thread_config(thread_id: str, namespace: str, checkpoint_id: str) -> dict[str, Any]:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": namespace,
            "checkpoint_id": checkpoint_id,
        }
    }


def frame(typed: tuple[str, bytes]) -> bytes:
    kind, data = typed
    return kind.encode() + b"\x00" + data


def unframe(payload: bytes) -> tuple[str, bytes]:
    kind, _, data = payload.partition(b"\x00")
    return kind.decode(), data


def _label(name: str, value: str) -> str:
    if len(value) > MAX_LABEL_CHARS:
        raise ValueError(f"{name} is {len(value)} characters; at most {MAX_LABEL_CHARS} fit")
    return value


def checkpoint_record(
    serde: Any,
    config: Config,
    place: Place,
    checkpoint: Mapping[str, Any],
    metadata: Mapping[str, Any],
) -> pb.StoredRecord:
    """A checkpoint as its record. TypeError (json's) for metadata that is not JSON,
    as SqliteSaver raises."""
    stored_metadata = get_checkpoint_metadata(config, metadata)
    labels = {THREAD_LABEL: _label("thread_id", place.thread_id)}
    run_id = stored_metadata.get("run_id")
    if run_id is not None:
        labels[RUN_LABEL] = _label("metadata run_id", str(run_id))
    return pb.StoredRecord(
        kind=CHECKPOINT,
        namespace=place.namespace,
        key=str(checkpoint["id"]),
        parent_key=place.checkpoint_id or "",
        metadata=json.dumps(stored_metadata, ensure_ascii=False),
        payload=frame(serde.dumps_typed(dict(checkpoint))),
        labels=labels,
    )


def write_records(
    serde: Any,
    place: Place,
    checkpoint_id: str,
    writes: Sequence[tuple[str, Any]],
    task_id: str,
    task_path: str,
) -> list[pb.StoredRecord]:
    """A task's writes as records, keyed (checkpoint, task, idx) as LangGraph keys
    them: special channels (errors, interrupts) take their negative index."""
    records = []
    for position, (channel, value) in enumerate(writes):
        idx = WRITES_IDX_MAP.get(channel, position)
        details = {"task_id": task_id, "channel": channel, "idx": idx, "task_path": task_path}
        records.append(
            pb.StoredRecord(
                kind=WRITES,
                namespace=place.namespace,
                key=f"{checkpoint_id}:{task_id}:{idx}",
                parent_key=checkpoint_id,
                metadata=json.dumps(details, ensure_ascii=False),
                payload=frame(serde.dumps_typed(value)),
                labels={
                    THREAD_LABEL: _label("thread_id", place.thread_id),
                    CHECKPOINT_LABEL: checkpoint_id,
                },
            )
        )
    return records


def pending_writes(serde: Any, records: Iterable[pb.StoredRecord]) -> list[tuple[str, str, Any]]:
    """Writes in `writes_sort_key` order, as `get_tuple` must answer them."""
    decoded = []
    for record in records:
        details = json.loads(record.metadata)
        order = writes_sort_key(details["task_path"], details["task_id"], details["idx"])
        value = serde.loads_typed(unframe(record.payload))
        decoded.append((order, (details["task_id"], details["channel"], value)))
    decoded.sort(key=lambda pair: pair[0])
    return [write for _, write in decoded]


def checkpoint_tuple(
    serde: Any, record: pb.StoredRecord, writes: Iterable[pb.StoredRecord]
) -> CheckpointTuple:
    thread_id = record.labels[THREAD_LABEL]
    parent = (
        thread_config(thread_id, record.namespace, record.parent_key) if record.parent_key else None
    )
    return CheckpointTuple(
        config=thread_config(thread_id, record.namespace, record.key),
        checkpoint=serde.loads_typed(unframe(record.payload)),
        metadata=json.loads(record.metadata) if record.metadata else {},
        parent_config=parent,
        pending_writes=pending_writes(serde, writes),
    )


def copied(record: pb.StoredRecord, thread_id: str) -> pb.StoredRecord:
    """A record as put again under another thread (copy_thread)."""
    copy = pb.StoredRecord()
    copy.CopyFrom(record)
    for answered_only in ("session_id", "sequence", "payload_size"):
        copy.ClearField(answered_only)
    copy.labels[THREAD_LABEL] = _label("thread_id", thread_id)
    return copy


def delta_channels(record: pb.StoredRecord) -> set[str]:
    """The DeltaChannel-backed channels of a checkpoint (from its metadata's counters):
    those whose value is rebuilt from ancestors' writes, back to a snapshot."""
    metadata = json.loads(record.metadata) if record.metadata else {}
    counters = metadata.get(DELTA_COUNTERS) or {}
    return set(counters)


def stored_channels(serde: Any, record: pb.StoredRecord) -> set[str]:
    """The channels whose value a checkpoint holds itself (a snapshot, for a delta
    channel): where the ancestor walk of a delta channel ends."""
    checkpoint = serde.loads_typed(unframe(record.payload))
    return set(checkpoint.get("channel_values") or {})


def next_version(current: str | int | float | None) -> str:
    """Versions as LangGraph's own savers make them: a zero-padded counter and a random
    fraction, so that strings sort by the counter."""
    import random

    if current is None:
        count = 0
    elif isinstance(current, int | float):
        count = int(current)
    else:
        count = int(current.split(".")[0])
    return f"{count + 1:032}.{random.random():016}"


class DeltaWalk:
    """DeltaChannel's ancestor walk (`get_delta_channel_history`), fed one ancestor at a
    time, newest first: each channel collects the ancestors' writes until the nearest
    ancestor that stores its value (the seed), as LangGraph's default walk does."""

    def __init__(self, serde: Any, channels: Sequence[str]) -> None:
        self.serde = serde
        self.channels = list(channels)
        self.remaining = set(channels)
        self.collected: dict[str, list[tuple[str, str, Any]]] = {c: [] for c in channels}
        self.seeds: dict[str, Any] = {}

    def visit(self, record: pb.StoredRecord, writes: Iterable[pb.StoredRecord]) -> bool:
        """One ancestor and its writes; False once every channel has its seed."""
        for write in reversed(pending_writes(self.serde, writes)):
            if write[1] in self.remaining:
                self.collected[write[1]].append(write)
        values = self.serde.loads_typed(unframe(record.payload)).get("channel_values") or {}
        for channel in list(self.remaining):
            if channel in values:
                self.seeds[channel] = values[channel]
                self.remaining.discard(channel)
        return bool(self.remaining)

    def result(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for channel in self.channels:
            entry: dict[str, Any] = {"writes": list(reversed(self.collected[channel]))}
            if channel in self.seeds:
                entry["seed"] = self.seeds[channel]
            found[channel] = entry
        return found
