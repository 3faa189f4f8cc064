"""Reads cost a bounded number of SQL statements, whatever the number of sessions and
the length of their histories (issue 13 item 2), on both backends.

Statements are counted by the backend's `StatementCounter` (switchboard/database.py):
every statement the server's code sends, deferred Postgres writes included, without
transaction control (BEGIN, SAVEPOINT, RELEASE, COMMIT, ROLLBACK) and the Postgres
clock sample. A write transaction's log lock (`EventLog.lock_log`) is counted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from session_service import recovery
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web

#: What one ListSessions page reads: the agent's row, then the page of session rows.
LIST_PAGE_STATEMENTS = 2
#: An existing route: the log lock, the agent's row, the route joined with its session.
RESOLVE_EXISTING_STATEMENTS = 3


def _statements(service: InProcessSession, call: Callable[[], Any]) -> list[str]:
    with service.unit.store.backend.statements.counting() as statements:
        call()
    return list(statements)


def _sessions_with_history(service: InProcessSession, sessions: int, events: int) -> list[str]:
    ids = []
    for n in range(sessions):
        session_id = resolve(service.stub, **web(f"tab-{n}")).session.session_id
        batch = [user_message(f"message {i}") for i in range(events)]
        append(service.stub, session_id, *batch)
        ids.append(session_id)
    return ids


def _list(service: InProcessSession, **request: Any) -> pb.ListSessionsResponse:
    return service.stub.ListSessions(pb.ListSessionsRequest(agent="main", **request))


def _folded(service: InProcessSession, session_id: str) -> pb.Session:
    """The session as a fold of its snapshot and events (what summaries must equal)."""
    request = pb.GetSessionStateRequest(agent="main", session_id=session_id)
    return service.stub.GetSessionState(request).state.session


def test_a_list_page_costs_the_same_few_statements_whatever_the_page_size_and_history(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    ids = _sessions_with_history(service, sessions=100, events=50)
    _list(service, page_size=100)  # warm: one-off reads of a fresh server are not counted

    whole = _statements(service, lambda: _list(service, page_size=100))
    small = _statements(service, lambda: _list(service, page_size=10))
    page = _list(service, page_size=10)
    second = _statements(
        service, lambda: _list(service, page_size=10, page_token=page.next_page_token)
    )

    assert len(whole) <= LIST_PAGE_STATEMENTS, whole
    assert len(small) <= LIST_PAGE_STATEMENTS, small
    assert len(second) <= LIST_PAGE_STATEMENTS, second
    listed = _list(service, page_size=100).sessions
    assert [s.session_id for s in listed] == ids[::-1]
    assert all(s.message_count == 50 for s in listed)


def test_resolving_an_existing_route_costs_three_statements(service: InProcessSession) -> None:
    create_agent(service.stub)
    first = resolve(service.stub, **web()).session
    append(service.stub, first.session_id, *[user_message(f"m{i}") for i in range(100)])
    resolve(service.stub, **web())  # warm

    found: list[pb.ResolveSessionResponse] = []
    counted = _statements(service, lambda: found.append(resolve(service.stub, **web())))

    assert len(counted) <= RESOLVE_EXISTING_STATEMENTS, counted
    assert not found[0].created
    assert found[0].session == _folded(service, first.session_id)


def test_joining_and_getting_a_session_read_its_row_not_its_history(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    append(service.stub, session_id, *[user_message(f"m{i}") for i in range(100)])
    get = pb.GetSessionRequest(agent="main", session_id=session_id)
    join = pb.ResolveSessionRequest(agent="main", session_id=session_id)
    service.stub.GetSession(get)  # warm

    got = _statements(service, lambda: service.stub.GetSession(get))
    joined = _statements(service, lambda: service.stub.ResolveSession(join))

    assert len(got) <= 1, got
    assert len(joined) <= 2, joined
    assert service.stub.GetSession(get).session == _folded(service, session_id)


def _changed_every_way(service: InProcessSession) -> list[str]:
    """Sessions whose summaries every kind of event moved: resume marks, suspension,
    ends, resets, forks and a rewind, agent settings and memory too."""
    create_agent(service.stub)
    stub = service.stub
    ids = _sessions_with_history(service, sessions=4, events=3)
    for session_id in (ids[0], ids[3]):  # ids[0] is rewound later: its row is refolded
        stub.MarkResumable(
            pb.MarkResumableRequest(agent="main", session_id=session_id, pending=True, holder="gw")
        )
    stub.SuspendSession(pb.SuspendSessionRequest(agent="main", session_id=ids[1], suspended=True))
    stub.EndSession(pb.EndSessionRequest(agent="main", session_id=ids[2], reason="done"))
    fresh = stub.ResetSession(pb.ResetSessionRequest(agent="main", session_id=ids[1])).session
    head = append(stub, ids[0], user_message("before the rewind")).events[0].sequence
    append(stub, ids[0], user_message("undone"))
    stub.Rewind(pb.RewindRequest(sequence=head))
    fork = stub.ForkSession(pb.ForkSessionRequest(agent="main", session_id=ids[0])).session
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="k", value="v"))
    return [*ids, fresh.session_id, fork.session_id]


def test_listed_summaries_are_the_fold_of_the_log_after_every_kind_of_change(
    service: InProcessSession,
) -> None:
    ids = _changed_every_way(service)
    listed = {s.session_id: s for s in _list(service, page_size=100).sessions}
    assert set(ids) <= set(listed)
    for session_id, session in listed.items():
        assert session == _folded(service, session_id), session_id
    assert not recovery.rebuild(service.unit.core).differed


def test_a_page_of_agents_is_one_statement_and_each_is_the_agent_without_memory(
    service: InProcessSession,
) -> None:
    _changed_every_way(service)  # "main": settings, memory, a rewind
    for n in range(30):
        create_agent(service.stub, f"agent-{n:02}", display_name=f"Agent {n}")
        service.stub.PutMemory(pb.PutMemoryRequest(agent=f"agent-{n:02}", key="k", value="v"))
    service.stub.DeleteAgent(pb.DeleteAgentRequest(name="agent-03"))
    request = pb.ListAgentsRequest(page_size=10, include_archived=True)
    service.stub.ListAgents(request)  # warm

    counted = _statements(service, lambda: service.stub.ListAgents(request))

    assert len(counted) <= 1, counted
    listed: list[pb.Agent] = []
    token = ""
    while True:
        page = service.stub.ListAgents(
            pb.ListAgentsRequest(page_size=10, include_archived=True, page_token=token)
        )
        listed.extend(page.agents)
        token = page.next_page_token
        if not token:
            break
    assert len(listed) == 31
    for agent in listed:
        whole = service.stub.GetAgent(pb.GetAgentRequest(name=agent.name)).agent
        whole.ClearField("memory")
        assert agent == whole, agent.name
    live = service.stub.ListAgents(pb.ListAgentsRequest(page_size=100)).agents
    assert "agent-03" not in {agent.name for agent in live}


def test_rows_without_summaries_are_read_by_folding_and_filled_at_start(
    start_session: StartSession,
) -> None:
    """A database migrated to the summary columns has NULL in them (the migration
    cannot fold the log): reads fold such rows, and the next start fills them."""
    service = start_session()
    ids = _changed_every_way(service)
    expected = {session_id: _folded(service, session_id) for session_id in ids}
    agents = service.stub.ListAgents(pb.ListAgentsRequest(include_archived=True)).agents
    store = service.unit.store
    database: Any = store.database
    with database.connection_context():
        database.execute_sql("UPDATE session_session SET summary = NULL")
        database.execute_sql("UPDATE session_agent SET summary = NULL")

    unfilled = {s.session_id: s for s in _list(service, page_size=100).sessions}
    assert {i: unfilled[i] for i in ids} == expected
    for session_id in ids:  # folded in one read snapshot
        request = pb.GetSessionRequest(agent="main", session_id=session_id)
        assert service.stub.GetSession(request).session == expected[session_id]
    assert service.stub.ListAgents(pb.ListAgentsRequest(include_archived=True)).agents == agents
    restarted = start_session()

    with database.connection_context():
        assert store.projections.unsummarized() == ([], [])
    filled = {s.session_id: s for s in _list(restarted, page_size=100).sessions}
    assert {i: filled[i] for i in ids} == expected
    assert len(_statements(restarted, lambda: _list(restarted, page_size=100))) <= 2


@pytest.mark.parametrize("events", [0, 30])
def test_resolve_creating_a_session_stays_correct(service: InProcessSession, events: int) -> None:
    """The cheap path must not change what a first or a reset resolve answers."""
    create_agent(service.stub, settings=pb.AgentSettings(reset=pb.ResetPolicy()))
    created = resolve(service.stub, **web())
    assert created.created
    if events:
        append(service.stub, created.session.session_id, *[user_message("x")] * events)
    again = resolve(service.stub, **web())
    assert not again.created
    assert again.session == _folded(service, created.session.session_id)
