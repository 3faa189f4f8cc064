"""Helpers for the tests of what agent frameworks store (issue 23): sources addressed
by a framework's own ids, state deltas, records, and the log head (to tell that a
refused call wrote nothing)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.status import error_reason

SESSION = pb.STATE_SCOPE_SESSION
USER = pb.STATE_SCOPE_USER
AGENT = pb.STATE_SCOPE_AGENT


def head(stub: pb_grpc.SessionServiceStub) -> int:
    """The log's newest sequence."""
    page = stub.ListLogEvents(pb.ListLogEventsRequest(newest=True, page_size=1))
    return int(page.head_sequence)


def adk_source(user_id: str, session_id: str) -> pb.Source:
    """How a Google ADK adapter addresses (app, user, session id): agent, user, conversation."""
    return pb.Source(transport="adk", conversation_id=session_id, user_id=user_id)


def open_adk(
    stub: pb_grpc.SessionServiceStub, user_id: str, session_id: str, agent: str = "main"
) -> pb.Session:
    request = pb.ResolveSessionRequest(agent=agent, source=adk_source(user_id, session_id))
    return stub.ResolveSession(request).session


def delta(
    scope: int, removed: tuple[str, ...] = (), user_id: str = "", **values: Any
) -> pb.StateDelta:
    """A delta setting `values` (JSON-encoded) and removing `removed`."""
    return pb.StateDelta(
        scope=scope,  # type: ignore[arg-type]
        user_id=user_id,
        set={key: json.dumps(value) for key, value in values.items()},
        removed=removed,
    )


def decoded(entries: Any) -> dict[str, Any]:
    return {key: json.loads(value) for key, value in entries.items()}


def refused(call: Any, code: grpc.StatusCode, reason: str = "") -> grpc.RpcError:
    """Runs `call`, expects it refused with `code` (and `reason`), returns the error."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error: grpc.RpcError = caught.value
    assert error.code() == code, error.details()
    if reason:
        assert error_reason(error) == reason, error.details()
    return error


def record(
    key: str, payload: bytes = b"", kind: str = "checkpoint", **fields: Any
) -> pb.StoredRecord:
    return pb.StoredRecord(kind=kind, key=key, payload=payload or key.encode(), **fields)


def put(
    stub: pb_grpc.SessionServiceStub,
    session_id: str,
    *records: pb.StoredRecord,
    agent: str = "main",
    **fields: Any,
) -> pb.PutRecordsResponse:
    return stub.PutRecords(
        pb.PutRecordsRequest(agent=agent, session_id=session_id, records=records, **fields)
    )


def version(stub: pb_grpc.SessionServiceStub, session_id: str, agent: str = "main") -> int:
    got = stub.GetSession(pb.GetSessionRequest(agent=agent, session_id=session_id))
    return int(got.session.version)
