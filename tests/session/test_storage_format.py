"""The log stores events in a format of its own, named on every row (issue 13 item 6):
rows are written in the current format, read through the one mapper, and a row in a
format this release does not know is refused with a clear status, never misread."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from session_service import storage_format
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import append, create_agent, resolve, user_message, web


def _formats(service: InProcessSession, table: str) -> set[int]:
    store: Any = service.unit.store
    with store.database.connection_context():
        rows = store.database.execute_sql(f"SELECT DISTINCT format FROM {table}").fetchall()
    return {int(row[0]) for row in rows}


def test_log_and_snapshot_rows_name_the_current_format(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    append(service.stub, session_id, user_message("hello"))
    service.stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=session_id))

    assert _formats(service, "session_log") == {storage_format.CURRENT}
    assert _formats(service, "session_snapshot") == {storage_format.CURRENT}


def test_a_row_in_an_unknown_format_is_refused_clearly_not_misread(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    [event] = append(service.stub, session_id, user_message("from the future")).events
    store: Any = service.unit.store
    with store.database.connection_context():
        store.database.execute_sql(
            store.tables.sql("UPDATE session_log SET format = ? WHERE seq = ?"), [7, event.sequence]
        )
    request = pb.GetHistoryRequest(agent="main", session_id=session_id)

    with pytest.raises(grpc.RpcError) as refused:
        service.stub.GetHistory(request)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "storage format 7" in (refused.value.details() or "")
    assert "newer release" in (refused.value.details() or "")
