"""The new writes take request ids like their neighbours (issue 23, server half): a
retry with the same id is answered with the first call's answer, byte for byte, and
writes nothing; on both backends, through real servers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import append, create_agent, user_message
from tests.session.frameworks import SESSION, delta, head, open_adk

Build = Callable[[str], tuple[str, Any]]

#: Each new write: (the stub method, its request) for a session with two messages.
WRITES: dict[str, Build] = {
    "RetractMessages": lambda s: (
        "RetractMessages",
        pb.RetractMessagesRequest(agent="main", session_id=s, newest_count=1),
    ),
    "UpdateState": lambda s: (
        "UpdateState",
        pb.UpdateStateRequest(agent="main", session_id=s, deltas=[delta(SESSION, k=1)]),
    ),
    "PutRecords": lambda s: (
        "PutRecords",
        pb.PutRecordsRequest(
            agent="main", session_id=s, records=[pb.StoredRecord(kind="checkpoint", key="c1")]
        ),
    ),
    "EraseRecords": lambda s: (
        "EraseRecords",
        pb.EraseRecordsRequest(agent="main", session_id=s, kind="checkpoint", all=True),
    ),
    "EraseSession": lambda s: ("EraseSession", pb.EraseSessionRequest(agent="main", session_id=s)),
}


@pytest.mark.parametrize("rpc", sorted(WRITES))
def test_a_retry_with_the_same_request_id_gets_the_first_answer_and_writes_nothing(
    service: InProcessSession, rpc: str
) -> None:
    create_agent(service.stub)
    session_id = open_adk(service.stub, "alice", "s-1").session_id
    append(service.stub, session_id, user_message("one"), user_message("two"))
    service.stub.PutRecords(
        pb.PutRecordsRequest(
            agent="main",
            session_id=session_id,
            records=[pb.StoredRecord(kind="checkpoint", key="c0")],
        )
    )
    method, request = WRITES[rpc](session_id)
    request.request_id = f"retry-{rpc}"
    call = getattr(service.stub, method)

    first = call(request)
    written = head(service.stub)
    again = call(request)

    assert again.SerializeToString() == first.SerializeToString()
    assert head(service.stub) == written
