"""The hot paths of what agent frameworks store cost a fixed number of SQL statements,
whatever the number of records, state entries and messages a session holds (issue 23,
server half): a LangGraph step is a put and a get_tuple, an ADK turn an append with
state deltas, an OpenAI pop a retraction. Counted as test_statement_counts.py counts,
on both backends."""

from __future__ import annotations

from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, create_agent, user_message
from tests.session.frameworks import SESSION, delta, open_adk, put, record
from tests.session.test_statement_counts import _statements

#: GetRecord: the session's row, the record's index row, its log row.
GET_RECORD_STATEMENTS = 3
#: ... with its children: their index rows too (their payloads come with the record's).
GET_RECORD_WITH_CHILDREN_STATEMENTS = 4


def _grown(service: InProcessSession, session_id: str, steps: int, start: int = 0) -> None:
    for step in range(start, start + steps):
        put(
            service.stub,
            session_id,
            record(f"c{step:05}", parent_key=f"c{step - 1:05}", labels={"run_id": "r"}),
            record(f"c{step:05}/w", kind="writes", parent_key=f"c{step:05}"),
        )
        service.stub.AppendEvents(
            pb.AppendEventsRequest(
                agent="main", session_id=session_id, events=[user_message(f"m{step}")],
                state_deltas=[pb.StateDelta(scope=SESSION, set={f"k{step}": str(step)})],
            )
        )  # fmt: skip


def _step_costs(service: InProcessSession, session_id: str, step: int) -> dict[str, int]:
    stub = service.stub
    get = pb.GetRecordRequest(agent="main", session_id=session_id, kind="checkpoint")
    children = pb.GetRecordRequest(
        agent="main", session_id=session_id, kind="checkpoint", key=f"c{step - 1:05}",
        children_kind="writes",
    )  # fmt: skip
    turn = pb.AppendEventsRequest(
        agent="main", session_id=session_id, events=[user_message("turn")],
        state_deltas=[delta(SESSION, turn=step)],
    )  # fmt: skip
    state = pb.GetSessionStateRequest(agent="main", session_id=session_id)
    pop = pb.RetractMessagesRequest(agent="main", session_id=session_id, newest_count=1)
    calls = {
        "put": lambda: put(stub, session_id, record(f"p{step}"), record(f"p{step}/w", kind="w")),
        "get": lambda: stub.GetRecord(get),
        "get_with_children": lambda: stub.GetRecord(children),
        "append_with_delta": lambda: stub.AppendEvents(turn),
        "state": lambda: stub.GetSessionState(state),
        "retract": lambda: stub.RetractMessages(pop),
    }
    # The fewer of two counts: a statement of another thread (a request-id prune, a
    # write's deferred statement) may land in one; the call's own never change.
    return {
        name: min(len(_statements(service, call)) for _ in range(2)) for name, call in calls.items()
    }


def test_a_step_costs_the_same_statements_at_ten_and_at_two_hundred_records(
    start_session: StartSession,
) -> None:
    # No snapshot falls inside a measured call: its cost is the cadence's, not the step's.
    service = start_session(SessionLimits(snapshot_every=10**6))
    create_agent(service.stub)
    session_id = open_adk(service.stub, "alice", "s-1").session_id
    _grown(service, session_id, 10)
    _step_costs(service, session_id, 10)  # warm: one-off reads of a fresh server
    small = _step_costs(service, session_id, 10)
    _grown(service, session_id, 190, start=11)
    large = _step_costs(service, session_id, 201)

    assert small == large, (small, large)
    assert large["get"] <= GET_RECORD_STATEMENTS, large
    assert large["get_with_children"] <= GET_RECORD_WITH_CHILDREN_STATEMENTS, large
