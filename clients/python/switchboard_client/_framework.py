"""What agent frameworks store, encoded: scoped state changes and their JSON values,
record label filters (the requests themselves are built in `_session_calls`)."""

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
