"""Writers racing on one session with expected_version (issue 23, server half): an
append with state deltas against a retraction or another such append, through two
replicas of one database. Exactly one wins each round, the other is ABORTED, and
the state is never half applied; on both backends."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.session.conftest import StartSession, append, create_agent, user_message
from tests.session.frameworks import SESSION, decoded, delta, open_adk, version

ROUNDS = 8


def _race(calls: list[Callable[[], Any]]) -> list[Any]:
    """Runs the calls at once; each result is the answer or the RpcError."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        try:
            return call()
        except grpc.RpcError as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _writer(
    stub: pb_grpc.SessionServiceStub, session_id: str, expected: int, mark: int
) -> Callable[[], Any]:
    request = pb.AppendEventsRequest(
        agent="main",
        session_id=session_id,
        expected_version=expected,
        events=[user_message(f"turn {mark}")],
        state_deltas=[delta(SESSION, first=mark, second=mark)],
    )
    return lambda: stub.AppendEvents(request)


def _retractor(
    stub: pb_grpc.SessionServiceStub, session_id: str, expected: int
) -> Callable[[], Any]:
    request = pb.RetractMessagesRequest(
        agent="main", session_id=session_id, newest_count=1, expected_version=expected
    )
    return lambda: stub.RetractMessages(request)


def test_one_writer_wins_each_round_and_the_state_is_never_half_applied(
    start_session: StartSession,
) -> None:
    one, two = start_session(), start_session()
    create_agent(one.stub)
    session_id = open_adk(one.stub, "alice", "s-1").session_id
    append(one.stub, session_id, user_message("first"))
    history = 1
    for round_number in range(ROUNDS):
        expected = version(one.stub, session_id)
        rival = (
            _retractor(two.stub, session_id, expected)
            if round_number % 2
            else _writer(two.stub, session_id, expected, 100 + round_number)
        )
        results = _race([_writer(one.stub, session_id, expected, round_number), rival])

        won = [r for r in results if not isinstance(r, grpc.RpcError)]
        lost = [r for r in results if isinstance(r, grpc.RpcError)]
        assert len(won) == 1 and len(lost) == 1, results
        assert lost[0].code() == grpc.StatusCode.ABORTED
        state = decoded(
            one.stub.GetSessionState(
                pb.GetSessionStateRequest(agent="main", session_id=session_id)
            ).scoped_state.session
        )
        assert state.get("first") == state.get("second"), "a delta applies whole or not at all"
        history += 1 if isinstance(won[0], pb.AppendEventsResponse) else -1
        assert version(one.stub, session_id) == won[0].version
    listed = one.stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=session_id))
    assert len(listed.messages) == history
