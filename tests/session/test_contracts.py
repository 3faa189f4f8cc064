"""Contract fixes of issue 13: history paged both ways and sized before it is read,
ListCheckpoints pages, the operators' log read, appends answered only when the
answer can be read (and so committed only then)."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from switchboard_client import SessionClient, SwitchboardError

from session_service.checks import _LOGGED_EVENT_OVERHEAD, MAX_EVENTS_PER_APPEND
from session_service.core import SessionLimits
from switchboard import pagination
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_cli.main import main
from tests.harness import InProcessSession
from tests.session.conftest import (
    StartSession,
    append,
    create_agent,
    resolve,
    user_message,
    web,
)
from tests.status import error_details, error_reason

BIG = 250_000  # below the default 256 KiB content limit


def _session(service: InProcessSession, conversation: str = "tab-1") -> str:
    return resolve(service.stub, **web(conversation)).session.session_id


def _texts(messages: Any) -> list[str]:
    return [q.message.content for q in messages]


def _all_history_pages(
    stub: pb_grpc.SessionServiceStub, session_id: str, **fields: Any
) -> list[list[str]]:
    pages, token = [], ""
    while True:
        page = stub.GetHistory(
            pb.GetHistoryRequest(agent="main", session_id=session_id, page_token=token, **fields)
        )
        pages.append(_texts(page.messages))
        token = page.next_page_token
        if not token:
            return pages


def _head(service: InProcessSession) -> int:
    store: Any = service.unit.store
    with store.database.connection_context():
        return int(store.log.head())


# -- GetHistory ---------------------------------------------------------------------------


def test_history_pages_backwards_newest_first(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    for n in range(7):
        append(service.stub, session_id, user_message(f"m{n}"))
    pages = _all_history_pages(service.stub, session_id, limit=3, newest=True)
    assert pages == [["m4", "m5", "m6"], ["m1", "m2", "m3"], ["m0"]]


def test_history_pages_forwards_oldest_first(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    for n in range(7):
        append(service.stub, session_id, user_message(f"m{n}"))
    pages = _all_history_pages(service.stub, session_id, limit=3)
    assert pages == [["m0", "m1", "m2"], ["m3", "m4", "m5"], ["m6"]]
    exact = _all_history_pages(service.stub, session_id, limit=7)
    assert exact == [[f"m{n}" for n in range(7)]], "no empty last page"


def test_history_before_sequence_bounds_both_directions(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    sequences = [
        append(service.stub, session_id, user_message(f"m{n}")).events[0].sequence for n in range(6)
    ]
    newest = _all_history_pages(
        service.stub, session_id, limit=2, newest=True, before_sequence=sequences[4]
    )
    assert newest == [["m2", "m3"], ["m0", "m1"]]
    window = _all_history_pages(
        service.stub,
        session_id,
        limit=10,
        after_sequence=sequences[0],
        before_sequence=sequences[3],
    )
    assert window == [["m1", "m2"]]


def test_a_history_token_is_bound_to_its_request(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    for n in range(3):
        append(service.stub, session_id, user_message(f"m{n}"))
    first = service.stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id, limit=1, newest=True)
    )
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.GetHistory(
            pb.GetHistoryRequest(
                agent="main", session_id=session_id, limit=1, page_token=first.next_page_token
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == "INVALID_PAGE_TOKEN"


def test_history_is_sized_before_it_is_read(service: InProcessSession) -> None:
    """20 messages of 250 KB: a page asking for all of them stops below 3 MiB, and no
    more payloads are loaded than the page returns (the sizes come first)."""
    create_agent(service.stub)
    session_id = _session(service)
    for n in range(20):
        append(service.stub, session_id, user_message(f"{n:02d}" + "x" * BIG))
    store: Any = service.unit.store
    loaded: list[int] = []
    original = store.log.payloads

    def counted(sql: str, params: Any) -> Any:
        events = original(sql, params)
        loaded.append(len(events))
        return events

    store.log.payloads = counted
    try:
        pages: list[pb.GetHistoryResponse] = []
        token = ""
        while True:
            page = service.stub.GetHistory(
                pb.GetHistoryRequest(
                    agent="main", session_id=session_id, limit=1000, newest=True, page_token=token
                )
            )
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
    finally:
        store.log.payloads = original
    assert all(page.ByteSize() <= pagination.MAX_ANSWER_BYTES for page in pages)
    returned = [len(page.messages) for page in pages]
    assert len(pages) > 1 and sum(returned) == 20
    history = [m[:2] for page in reversed(pages) for m in _texts(page.messages)]
    assert history == [f"{n:02d}" for n in range(20)], "newest pages backwards, none lost"
    assert max(loaded) <= max(returned), "a read loaded payloads it then left out"


def test_a_history_page_costs_the_same_statements_at_any_length(
    service: InProcessSession,
) -> None:
    """Counted at the database layer: a page of 5 costs as many statements on a
    history of 10 messages as on one of 300 (5 today: the session's row, the
    timeline's head twice, the sizes, the payloads)."""
    create_agent(service.stub)
    short, long = _session(service, "short"), _session(service, "long")
    for n in range(300):
        if n < 10:
            append(service.stub, short, user_message(f"s{n}"))
        append(service.stub, long, user_message(f"l{n}"))
    database: Any = service.unit.store.database
    original = database.execute_sql
    counted: list[str] = []

    def counting(sql: str, *args: Any, **kwargs: Any) -> Any:
        counted.append(sql)
        return original(sql, *args, **kwargs)

    costs = {}
    database.execute_sql = counting
    try:
        for session_id in (short, long):
            for newest in (False, True):
                # The fewest of three: the server's own background reads (health, the
                # watchers' tailer) can only add statements to a count, never take any.
                tries = []
                for _ in range(3):
                    counted.clear()
                    page = service.stub.GetHistory(
                        pb.GetHistoryRequest(
                            agent="main", session_id=session_id, limit=5, newest=newest
                        )
                    )
                    assert len(page.messages) == 5 and page.next_page_token
                    tries.append(len(counted))
                costs[(session_id, newest)] = min(tries)
    finally:
        database.execute_sql = original
    assert costs[(short, False)] == costs[(long, False)] <= 6, costs
    assert costs[(short, True)] == costs[(long, True)] <= 6, costs


# -- ListCheckpoints ----------------------------------------------------------------------


def test_list_checkpoints_pages_oldest_first(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    labels = []
    for n in range(5):
        append(service.stub, session_id, user_message(f"m{n}"))
        for suffix in ("b", "a"):  # two at one sequence: ordered by label
            label = f"cp-{n}-{suffix}"
            service.stub.CreateCheckpoint(pb.CreateCheckpointRequest(label=label))
            labels.append(label)
    seen, token = [], ""
    while True:
        page = service.stub.ListCheckpoints(
            pb.ListCheckpointsRequest(page_size=3, page_token=token)
        )
        assert len(page.checkpoints) <= 3
        seen += [c.label for c in page.checkpoints]
        token = page.next_page_token
        if not token:
            break
    expected = [f"cp-{n}-{s}" for n in range(5) for s in ("a", "b")]
    assert seen == expected
    everything = service.stub.ListCheckpoints(pb.ListCheckpointsRequest())
    assert [c.label for c in everything.checkpoints] == expected
    assert not everything.next_page_token
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ListCheckpoints(pb.ListCheckpointsRequest(page_token="bogus"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- ListLogEvents ------------------------------------------------------------------------


def _log(service: InProcessSession, **fields: Any) -> list[pb.LogEntry]:
    entries, token = [], ""
    while True:
        page = service.stub.ListLogEvents(pb.ListLogEventsRequest(page_token=token, **fields))
        entries += list(page.entries)
        token = page.next_page_token
        if not token:
            return entries


def test_the_log_reads_by_range_agent_session_and_type(service: InProcessSession) -> None:
    create_agent(service.stub)
    create_agent(service.stub, "other")
    one, two = _session(service, "a"), _session(service, "b")
    theirs = resolve(service.stub, "other", **web("c")).session.session_id
    for n in range(3):
        append(service.stub, one, user_message(f"one-{n}"))
        append(service.stub, two, user_message(f"two-{n}"))
        append(service.stub, theirs, user_message(f"theirs-{n}"), agent="other")
    everything = _log(service, page_size=4)
    assert [e.event.sequence for e in everything] == list(range(1, _head(service) + 1))
    assert not any(e.abandoned for e in everything)
    mine = _log(service, agent="main", page_size=2)
    assert {e.event.agent for e in mine} == {"main"}
    assert [e.event.session_id for e in mine if e.event.session_id] == [
        e.event.session_id for e in everything if e.event.agent == "main" and e.event.session_id
    ]
    in_two = _log(service, session_id=two, event_types=["message_appended"])
    assert [e.event.message_appended.message.content for e in in_two] == [
        f"two-{n}" for n in range(3)
    ]
    opened = _log(service, event_types=["session_opened", "agent_created"])
    assert [e.event.WhichOneof("body") for e in opened] == [
        "agent_created",
        "agent_created",
        "session_opened",
        "session_opened",
        "session_opened",
    ]
    middle = _log(service, after_sequence=3, before_sequence=7)
    assert [e.event.sequence for e in middle] == [4, 5, 6]


def test_the_log_reads_active_or_abandoned_branches(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    kept = append(service.stub, session_id, user_message("kept")).events[0].sequence
    for text in ("gone-1", "gone-2"):
        append(service.stub, session_id, user_message(text))
    service.stub.Rewind(pb.RewindRequest(sequence=kept))
    append(service.stub, session_id, user_message("after"))

    def texts(branch: int) -> list[tuple[str, bool]]:
        entries = _log(service, branch=branch, event_types=["message_appended"])
        return [(e.event.message_appended.message.content, e.abandoned) for e in entries]

    assert texts(pb.LOG_BRANCH_UNSPECIFIED) == [
        ("kept", False),
        ("gone-1", True),
        ("gone-2", True),
        ("after", False),
    ]
    assert texts(pb.LOG_BRANCH_ACTIVE) == [("kept", False), ("after", False)]
    assert texts(pb.LOG_BRANCH_ABANDONED) == [("gone-1", True), ("gone-2", True)]
    rewound = _log(service, event_types=["rewound"])
    assert [e.event.rewound.to_sequence for e in rewound] == [kept]


def test_a_log_page_is_bounded_by_bytes(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    for _ in range(16):
        append(service.stub, session_id, user_message("y" * BIG))
    pages, token = [], ""
    while True:
        page = service.stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000, page_token=token))
        pages.append(page)
        token = page.next_page_token
        if not token:
            break
    assert len(pages) > 1
    assert all(page.ByteSize() <= pagination.MAX_ANSWER_BYTES for page in pages)
    sequences = [e.event.sequence for page in pages for e in page.entries]
    assert sequences == list(range(1, _head(service) + 1))


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"event_types": ["message_appended", "no_such_event"]}, "event_types[1]"),
        ({"agent": "Not An Agent"}, "agent"),
        ({"session_id": "../x"}, "session_id"),
        ({"after_sequence": 2**63}, "after_sequence"),
        ({"branch": 7}, "branch"),
        ({"page_token": "bogus"}, "page_token"),
    ],
)
def test_a_bad_log_read_names_the_field(
    service: InProcessSession, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ListLogEvents(pb.ListLogEventsRequest(**fields))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[1] == [field]


def test_the_log_command_prints_the_filtered_log(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    append(service.stub, session_id, user_message("hello"))
    runner = CliRunner()
    shown = runner.invoke(
        main,
        ["session", "log", "--address", service.address, "--type", "message_appended", "--json"],
    )
    assert shown.exit_code == 0, shown.output
    [line] = shown.stdout.splitlines()  # the in-process server logs to stderr
    entry = json.loads(line)
    assert entry["event"]["message_appended"]["message"]["content"] == "hello"  # snake_case
    table = runner.invoke(main, ["session", "log", "--address", service.address])
    assert table.exit_code == 0, table.output
    assert "session_opened" in table.output and "message_appended" in table.output


# -- answers sized before commit ----------------------------------------------------------


def _five_megabytes() -> list[pb.SessionEventInput]:
    return [user_message(f"{n:02d}" + "z" * BIG) for n in range(21)]  # 5.25 MB


def test_an_unanswerable_append_is_refused_before_anything_is_written(
    service: InProcessSession,
) -> None:
    """Through the default client (4 MiB receive limit): a valid 5 MB append used to
    commit and then fail on the way back, so the caller's retry stored it twice. Now
    it is refused before it is written, retries change nothing, and with
    sequences_only it commits once and is acknowledged."""
    create_agent(service.stub)
    session_id = _session(service)
    head = _head(service)
    with SessionClient(service.address) as client:
        for _ in range(2):  # the caller retries what it takes for a failure
            with pytest.raises(SwitchboardError) as refused:
                client.append("main", session_id, *_five_megabytes())
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.reason == "ANSWER_TOO_LARGE"
        assert _head(service) == head, "a refused append wrote to the log"
        assert client.history("main", session_id) == []
        done = client.append("main", session_id, *_five_megabytes(), sequences_only=True)
        assert list(done.events) == [] and len(done.sequences) == 21
        assert done.sequences == list(range(head + 1, head + 22))
        stored = [m for page in client.history_pages("main", session_id) for m in page.messages]
        assert [m.sequence for m in stored] == list(done.sequences), "stored exactly once"
        assert done.version == client.get_session("main", session_id).version


def test_an_append_that_fits_still_echoes_its_events(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = _session(service)
    with SessionClient(service.address) as client:
        done = client.append("main", session_id, *_five_megabytes()[:12])  # 3.0 MB
    assert [e.sequence for e in done.events] == list(done.sequences)
    assert len(done.events) == 12
    assert done.ByteSize() <= pagination.MAX_ANSWER_BYTES, "the estimate fell short"


def test_the_largest_accepted_append_is_answered_within_the_bound(
    service: InProcessSession,
) -> None:
    """The size estimate made before the write is an upper bound: 100 events sized to
    just pass it get an answer no bigger than the bound."""
    create_agent(service.stub)
    session_id = _session(service)
    count = MAX_EVENTS_PER_APPEND

    def sized(padding: int) -> tuple[list[pb.SessionEventInput], int]:
        events = [user_message(f"{n:03d}" + "p" * padding) for n in range(count)]
        extra = len("main") + len(session_id) + _LOGGED_EVENT_OVERHEAD
        return events, sum(e.ByteSize() + extra for e in events)

    padding = pagination.MAX_ANSWER_BYTES // count
    events, estimate = sized(padding)
    while estimate > pagination.MAX_ANSWER_BYTES:  # the largest that passes
        padding -= -(-(estimate - pagination.MAX_ANSWER_BYTES) // count)
        events, estimate = sized(padding)
    assert pagination.MAX_ANSWER_BYTES - count < estimate <= pagination.MAX_ANSWER_BYTES
    done = append(service.stub, session_id, *events)
    assert len(done.events) == count
    assert done.ByteSize() <= pagination.MAX_ANSWER_BYTES, "the estimate fell short"


def test_an_unanswerable_inbox_post_is_refused_unwritten(start_session: StartSession) -> None:
    """A server allowing huge messages still answers only what a client can read."""
    service = start_session(SessionLimits(max_content_bytes=8 * 1024 * 1024))
    create_agent(service.stub)
    session_id = _session(service)
    head = _head(service)
    huge = pb.Message(role=pb.ROLE_USER, content="w" * (4 * 1024 * 1024))
    with SessionClient(service.address) as client, pytest.raises(SwitchboardError) as refused:
        client.post_to_inbox("main", session_id, huge)
    assert refused.value.reason == "ANSWER_TOO_LARGE"
    assert _head(service) == head
