"""The requests of what agent frameworks store (scoped state, retractions, stored
records, erasure), built once for the blocking and the asyncio session clients."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from switchboard.session.v1 import session_service_pb2 as pb

#: Label filters: label name -> the values it may have (any of them).
Labels = Mapping[str, Sequence[str]]


def state_delta(
    scope: pb.StateScope.ValueType,
    values: Mapping[str, Any] | None = None,
    removed: Sequence[str] = (),
    *,
    user_id: str = "",
) -> pb.StateDelta:
    """A scoped state change: `values` set (each encoded as JSON text), `removed`
    removed. `user_id` names the user of a STATE_SCOPE_USER change (empty: the
    session's user)."""
    return pb.StateDelta(
        scope=scope,
        user_id=user_id,
        set={key: json.dumps(value) for key, value in (values or {}).items()},
        removed=removed,
    )


def state_values(entries: Mapping[str, str]) -> dict[str, Any]:
    """Scoped state entries as their values (the service keeps JSON text)."""
    return {key: json.loads(value) for key, value in entries.items()}


def label_filters(labels: Labels | None) -> list[pb.RecordLabelFilter]:
    return [
        pb.RecordLabelFilter(name=name, values=list(values))
        for name, values in (labels or {}).items()
    ]


def retract_request(
    agent: str,
    session_id: str,
    newest_count: int,
    sequences: Sequence[int],
    expected_version: int | None,
) -> pb.RetractMessagesRequest:
    request = pb.RetractMessagesRequest(
        agent=agent, session_id=session_id, newest_count=newest_count, sequences=sequences
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def update_state_request(
    agent: str,
    deltas: Sequence[pb.StateDelta],
    session_id: str,
    expected_version: int | None,
) -> pb.UpdateStateRequest:
    request = pb.UpdateStateRequest(agent=agent, session_id=session_id, deltas=deltas)
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def put_records_request(
    agent: str,
    session_id: str,
    records: Sequence[pb.StoredRecord],
    versioned: bool,
    expected_version: int | None,
) -> pb.PutRecordsRequest:
    request = pb.PutRecordsRequest(
        agent=agent, session_id=session_id, records=records, versioned=versioned
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return request


def list_records_request(
    agent: str,
    kind: str,
    *,
    session_id: str = "",
    namespace: str | None = None,
    keys: Sequence[str] = (),
    parent_key: str | None = None,
    before_key: str = "",
    labels: Labels | None = None,
    metadata_filter: Mapping[str, Any] | None = None,
    include_payloads: bool = False,
    page_size: int = 0,
) -> pb.ListRecordsRequest:
    """`metadata_filter` values are compared as JSON values (encoded here)."""
    request = pb.ListRecordsRequest(
        agent=agent,
        session_id=session_id,
        kind=kind,
        keys=keys,
        before_key=before_key,
        labels=label_filters(labels),
        metadata_filter={k: json.dumps(v) for k, v in (metadata_filter or {}).items()},
        include_payloads=include_payloads,
        page_size=page_size,
    )
    if namespace is not None:
        request.namespace = namespace
    if parent_key is not None:
        request.parent_key = parent_key
    return request


def erase_records_request(
    agent: str,
    kind: str,
    *,
    session_id: str = "",
    namespace: str | None = None,
    keys: Sequence[str] = (),
    labels: Labels | None = None,
    all_records: bool = False,
    keep_newest_per_namespace: int | None = None,
    children_kind: str = "",
) -> pb.EraseRecordsRequest:
    request = pb.EraseRecordsRequest(
        agent=agent,
        session_id=session_id,
        kind=kind,
        keys=keys,
        labels=label_filters(labels),
        all=all_records,
        children_kind=children_kind,
    )
    if namespace is not None:
        request.namespace = namespace
    if keep_newest_per_namespace is not None:
        request.keep_newest_per_namespace = keep_newest_per_namespace
    return request
