"""Forks reference their parent's history instead of copying it (issue 13 item 4), on
both backends: a fork writes one event whatever the history's length, reads walk the
lineage (a fork of a fork of a fork) in a bounded number of statements, both ways and
by pages, and rewinds, checkouts, rebuilds and restarts keep it whole."""

from __future__ import annotations

from typing import Any

from session_service import records, recovery
from session_service.agents import Agents
from session_service.conversations import Conversations
from switchboard import pagination
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, InProcessSession
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web


def _log_size(service: InProcessSession) -> tuple[int, int]:
    """(rows, payload bytes) of the whole log, read straight from the database."""
    store: Any = service.unit.store
    with store.database.connection_context():
        rows, size = store.database.execute_sql(
            "SELECT COUNT(*), SUM(LENGTH(payload)) FROM session_log"
        ).fetchone()
    return int(rows), int(size)


def _history(service: InProcessSession, session_id: str, **request: Any) -> list[str]:
    """Every message of the history, read page by page."""
    contents: list[str] = []
    token = ""
    while True:
        page = service.stub.GetHistory(
            pb.GetHistoryRequest(agent="main", session_id=session_id, page_token=token, **request)
        )
        assert page.ByteSize() <= pagination.MAX_ANSWER_BYTES, "a page past the byte budget"
        batch = [m.message.content for m in page.messages]
        contents.extend(reversed(batch) if request.get("newest") else batch)
        token = page.next_page_token
        if not token:
            return list(reversed(contents)) if request.get("newest") else contents


def _fork(service: InProcessSession, session_id: str, at: int = 0) -> pb.Session:
    request = pb.ForkSessionRequest(agent="main", session_id=session_id, at_sequence=at)
    return service.stub.ForkSession(request).session


def _say(service: InProcessSession, session_id: str, *texts: str) -> list[int]:
    events = append(service.stub, session_id, *(user_message(t) for t in texts)).events
    return [event.sequence for event in events]


def test_a_fork_writes_one_small_event_whatever_the_history_length(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    big = "x" * 100_000
    for batch in range(40):  # 4 MB of history: more than one answer's 3 MiB
        _say(service, session_id, f"{batch} {big}")
    rows, size = _log_size(service)

    fork = _fork(service, session_id)

    fork_rows, fork_size = _log_size(service)
    assert fork_rows - rows == 1, "a fork is its SessionOpened event, nothing copied"
    assert fork_size - size < 2_000
    assert fork.message_count == 40
    assert fork.lineage.shares_parent_history
    parent = _history(service, session_id)
    assert len(parent) == 40
    assert _history(service, fork.session_id, limit=3) == parent
    # Pages cut by bytes where the fork's own messages meet the parent's, both ways:
    # 31 own messages nearly fill one answer, so the parent's first would not fit.
    for n in range(31):
        _say(service, fork.session_id, f"own {n} {big}")
    whole = [*parent, *(f"own {n} {big}" for n in range(31))]
    assert _history(service, fork.session_id) == whole
    assert _history(service, fork.session_id, newest=True) == whole


def test_forks_of_forks_read_each_ancestor_up_to_its_fork_point(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    root = resolve(service.stub, **web()).session.session_id
    _, b = _say(service, root, "a", "b")
    _say(service, root, "root after the fork")
    child = _fork(service, root, at=b).session_id
    [c] = _say(service, child, "c")
    _say(service, child, "child after the fork")
    grandchild = _fork(service, child, at=c).session_id
    d, _ = _say(service, grandchild, "d", "e")

    expected = ["a", "b", "c", "d", "e"]
    for page_size in (1, 2, 100):
        assert _history(service, grandchild, limit=page_size) == expected
        assert _history(service, grandchild, limit=page_size, newest=True) == expected
    state = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=grandchild)
    ).state
    assert state.session.message_count == 5
    assert _history(service, child) == ["a", "b", "c", "child after the fork"]
    assert _history(service, root) == ["a", "b", "root after the fork"]
    # A fork from within the fork's own part: none of its later messages.
    early = _fork(service, grandchild, at=d).session_id
    assert _history(service, early) == ["a", "b", "c", "d"]


def test_a_page_of_a_fork_costs_what_it_holds_not_what_it_inherits(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    parent = resolve(service.stub, **web()).session.session_id
    _say(service, parent, *(f"parent {n}" for n in range(100)))
    _say(service, parent, *(f"parent {n}" for n in range(100, 200)))
    fork = _fork(service, parent).session_id
    _say(service, fork, *(f"fork {n}" for n in range(20)))
    store: Any = service.unit.store

    def statements(session_id: str, **request: Any) -> int:
        read = pb.GetHistoryRequest(agent="main", session_id=session_id, **request)
        with store.backend.statements.counting() as counted:
            service.stub.GetHistory(read)
        return len(counted)

    statements(parent, limit=10, newest=True)  # warm
    one_segment = statements(parent, limit=10, newest=True)
    # The lineage lookup, then the page's segments: the fork's own rows only...
    assert statements(fork, limit=10, newest=True) == one_segment + 1
    # ...or the parent's oldest rows only...
    assert statements(fork, limit=10) == one_segment + 1
    # ...or both, where the page crosses the fork point (a segment: sizes, then rows).
    assert statements(fork, limit=30, newest=True) == one_segment + 1 + 2
    page = service.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=fork, limit=30, newest=True)
    )
    contents = [m.message.content for m in page.messages]
    assert contents == [f"parent {n}" for n in range(190, 200)] + [f"fork {n}" for n in range(20)]
    assert page.next_page_token
    # A page that fills up exactly where the fork's own rows end still has a next one.
    own = service.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=fork, limit=20, newest=True)
    )
    assert [m.message.content for m in own.messages] == [f"fork {n}" for n in range(20)]
    assert own.next_page_token


def test_rewinds_checkouts_rebuilds_and_restarts_keep_a_fork_whole(
    start_session: StartSession,
) -> None:
    service = start_session()
    create_agent(service.stub)
    root = resolve(service.stub, **web()).session.session_id
    [a] = _say(service, root, "a")
    child = _fork(service, root).session_id
    _say(service, child, "b")
    grandchild = _fork(service, child).session_id
    [head] = _say(service, grandchild, "c")

    service.stub.Rewind(pb.RewindRequest(sequence=a))  # before either fork was made
    listed = service.stub.ListSessions(pb.ListSessionsRequest(agent="main")).sessions
    assert [s.session_id for s in listed] == [root]
    service.stub.Checkout(pb.CheckoutRequest(sequence=head))
    assert _history(service, grandchild) == ["a", "b", "c"]

    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences
    assert _history(service, grandchild) == ["a", "b", "c"]

    restarted = start_session()
    assert _history(restarted, grandchild, limit=1) == ["a", "b", "c"]
    assert _history(restarted, child) == ["a", "b"]


def test_a_fork_made_by_a_release_that_copied_the_history_still_reads_its_copy(
    service: InProcessSession, loop_thread: EventLoopThread
) -> None:
    create_agent(service.stub)
    parent = resolve(service.stub, **web()).session.session_id
    [a] = _say(service, parent, "a")
    sessions = service.unit.core
    conversations = Conversations(sessions, Agents(sessions))
    lineage = records.Lineage(parent_session_id=parent, parent_agent="main", forked_at_sequence=a)

    def copying_fork(now: float) -> records.Session:
        opened = conversations.open_session(
            now, "main", "old-fork", "", records.Source(), lineage=lineage
        )
        message = records.Message(role=records.Role.USER, content="a")
        copy = records.Event(
            agent="main",
            session_id="old-fork",
            session_version=opened.version + 1,
            body=records.MessageAppended(message=message),
        )
        sessions.log(now, [copy])
        return opened

    loop_thread.run(sessions.write(copying_fork))
    assert _history(service, "old-fork") == ["a"], "its own copy, not the parent's too"
    assert _history(service, _fork(service, "old-fork").session_id) == ["a"]
