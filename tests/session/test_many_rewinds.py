"""Rewinds cost what they touch, forever: thousands of rewinds to distinct points, then
every read and move still works, agrees with the model, and reads run the same
statements as on a log that was never rewound. Plus preview and the truthful no-op.

The default run makes 1,000 rewinds (past the ~77 at which reads once failed on
SQLite, and enough for the statement counts to show a read flat in them);
`SWITCHBOARD_REWINDS=10000` is the long round (about 13 minutes on Postgres on a
loaded 2-core machine)."""

from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from session_service import convert, records
from session_service.app import SessionUnit
from session_service.migrations import FRAMEWORK_TABLES, SESSION_SCHEMA
from session_service.time_travel import TimeTravel
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import append, create_agent, resolve, user_message, web
from tests.status import error_reason
from tests.test_migrations import (
    _drop_active_markers,
    _drop_inbound_refs,
    _drop_storage_formats,
)

REWINDS = int(os.environ.get("SWITCHBOARD_REWINDS", "1000"))
#: Newest-first history page the reads compare.
PAGE = 100
#: Rounds per write transaction while building.
BATCH = 250


def _temp(value: str) -> pb.SessionEventInput:
    return pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(set={"last": value}))


def _pair(i: int) -> list[pb.SessionEventInput]:
    """What each round appends: a message to keep and one to abandon, each with the
    state it leaves behind (so the state shows which one is current)."""
    return [user_message(f"k{i}"), _temp(f"k{i}"), user_message(f"d{i}"), _temp(f"d{i}")]


@dataclass(frozen=True)
class Round:
    kept: int  # the sequence of the kept half's last event: the rewind's target
    dropped: int  # the sequence of the abandoned half's last event


def _build(unit: SessionUnit, session_id: str, first: int, count: int) -> list[Round]:
    """`count` rounds of append-two-halves, rewind-to-the-first, by the core's own rules,
    `BATCH` rounds per write transaction (a commit per call would take minutes; on
    Postgres, one transaction for all would leave each updated row a chain of
    thousands of versions that every later statement walks)."""
    rounds: list[Round] = []
    for start in range(first, first + count, BATCH):
        rounds += _build_batch(unit, session_id, start, min(BATCH, first + count - start))
    return rounds


def _build_batch(unit: SessionUnit, session_id: str, first: int, count: int) -> list[Round]:
    travel = TimeTravel(unit.core)

    def op(now: float) -> list[Round]:
        rounds = []
        for i in range(first, first + count):
            index = unit.store.projections.session_index(session_id)
            assert index is not None
            events = []
            for offset, body in enumerate(_pair(i)):
                record = convert.input_body(body)
                assert record is not None
                event = records.Event(
                    agent="main",
                    session_id=session_id,
                    session_version=index.version + offset + 1,
                    body=record,
                )
                events.append(event)
            logged = unit.core.log(now, events, index)
            moved = travel.rewind_within(now, logged[1].sequence)
            assert (moved.abandoned, moved.to_sequence) == (2, logged[1].sequence)
            rounds.append(Round(logged[1].sequence, logged[3].sequence))
        return rounds

    rounds: list[Round] = unit.runner.submit_write(op).result()
    return rounds


@contextmanager
def _statements(unit: SessionUnit) -> Iterator[list[str]]:
    """The SQL text of every statement the database layer runs meanwhile."""
    database: Any = unit.store.database
    seen: list[str] = []
    original = database.execute_sql
    lock = threading.Lock()

    def recording(sql: str, params: Any = None, *args: Any, **kwargs: Any) -> Any:
        with lock:
            seen.append(sql)
        return original(sql, params, *args, **kwargs)

    database.execute_sql = recording
    try:
        yield seen
    finally:
        del database.execute_sql


def _reads(service: InProcessSession, session_id: str) -> tuple[pb.SessionState, list[str]]:
    stub = service.stub
    state = stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    ).state
    history = stub.GetHistory(
        pb.GetHistoryRequest(agent="main", session_id=session_id, limit=PAGE, newest=True)
    ).messages
    return state, [m.message.content for m in history]


def _read_statements(service: InProcessSession, session_id: str) -> list[str]:
    with _statements(service.unit) as seen:
        _reads(service, session_id)
    return list(seen)


def _expected_page(kept: int, extra: tuple[str, ...] = ()) -> list[str]:
    texts = [f"k{i}" for i in range(kept)] + list(extra)
    return texts[-PAGE:]


# 10,000 rewinds take about 3 minutes on Postgres (35 statements per rewind, flat in the
# number of rewinds): above the suite's 300 s per-test limit on a loaded machine.
@pytest.mark.timeout(900)
def test_thousands_of_rewinds_then_reads_moves_and_a_restart(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with ExitStack() as stack:
        service = stack.enter_context(
            session_server(loop_thread, database_url, health_probe_interval_s=3600.0)
        )
        stub = service.stub
        create_agent(stub)
        session_id = resolve(stub, **web()).session.session_id
        # The same reads on a log never rewound: one kept half, nothing abandoned.
        append(stub, session_id, *_pair(0)[:2])
        unrewound = _read_statements(service, session_id)

        rounds = _build(service.unit, session_id, 1, REWINDS)
        state, page = _reads(service, session_id)
        assert state.temp_state["last"] == f"k{REWINDS}"
        assert page == _expected_page(REWINDS + 1)
        assert _read_statements(service, session_id) == unrewound, (
            "a read runs the same statements, whatever the number of past rewinds"
        )

        # An append, a rewind and a checkout through the service.
        appended = append(stub, session_id, user_message("after"), _temp("after")).events
        state, page = _reads(service, session_id)
        assert (state.temp_state["last"], page[-1]) == ("after", "after")
        target = rounds[REWINDS // 2]  # the middle round: its kept half stays
        back = stub.Rewind(pb.RewindRequest(sequence=target.kept))
        assert not back.unchanged and back.record.rewound.to_sequence == target.kept
        state, page = _reads(service, session_id)
        assert state.temp_state["last"] == f"k{REWINDS // 2 + 1}"
        assert page == _expected_page(REWINDS // 2 + 2)

        # Onto the abandoned half of a later round (7,000 of 10,000): the world as it was then.
        later = REWINDS * 7 // 10
        onto = rounds[later]
        checked = stub.Checkout(pb.CheckoutRequest(sequence=onto.dropped))
        assert checked.record.rewound.checkout and not checked.unchanged
        dropped = f"d{later + 1}"
        expected_page = _expected_page(later + 2, extra=(dropped,))
        state, page = _reads(service, session_id)
        assert (state.temp_state["last"], page) == (dropped, expected_page)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Rewind(pb.RewindRequest(sequence=appended[0].sequence))
        assert error_reason(refused.value) == "REWIND_INTO_ABANDONED"

        stack.close()  # a restart
        service = stack.enter_context(
            session_server(loop_thread, database_url, health_probe_interval_s=3600.0)
        )
        state, page = _reads(service, session_id)
        assert (state.temp_state["last"], page) == (dropped, expected_page)
        assert _read_statements(service, session_id) == unrewound
        more = append(service.stub, session_id, user_message("later")).events[0]
        assert _reads(service, session_id)[1][-1] == "later"
        assert more.sequence > checked.record.sequence


def test_rewind_and_checkout_preview_write_nothing_and_tell_what_would_change(
    service: InProcessSession,
) -> None:
    stub = service.stub
    create_agent(stub)
    first = resolve(stub, **web("tab-a")).session.session_id
    append(stub, first, user_message("kept"))
    mark = stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="cut")).checkpoint.sequence
    append(stub, first, user_message("x"), user_message("y"))
    second = resolve(stub, **web("tab-b")).session.session_id
    stub.PutMemory(pb.PutMemoryRequest(agent="main", key="k", value="v"))
    head = _head(stub)

    preview = stub.Rewind(pb.RewindRequest(checkpoint="cut", preview=True))
    assert not preview.HasField("record") and not preview.unchanged
    assert preview.to_sequence == mark
    effects = {(e.agent, e.session_id): e.abandoned_count for e in preview.summary.effects}
    assert effects == {("main", ""): 1, ("main", first): 2, ("main", second): 1}
    assert (preview.summary.abandoned_count, preview.summary.changed_count) == (4, 3)
    assert not preview.summary.truncated
    assert _head(stub) == head, "a preview writes nothing"
    assert _texts(stub, first) == ["kept", "x", "y"]

    done = stub.Rewind(pb.RewindRequest(checkpoint="cut"))
    assert done.summary == preview.summary, "the preview told what the rewind does"
    assert done.record.sequence == head + 1

    after_rewind = _head(stub)
    restore = stub.Checkout(pb.CheckoutRequest(sequence=head, preview=True))
    assert not restore.HasField("record")
    restored = {(e.agent, e.session_id): e.restored_count for e in restore.summary.effects}
    assert restored == {("main", ""): 1, ("main", first): 2, ("main", second): 1}
    assert restore.summary.restored_count == 4 and restore.summary.abandoned_count == 0
    assert _head(stub) == after_rewind and _texts(stub, first) == ["kept"]
    assert stub.Checkout(pb.CheckoutRequest(sequence=head)).summary == restore.summary
    assert _texts(stub, first) == ["kept", "x", "y"]

    with pytest.raises(grpc.RpcError) as refused:
        stub.Rewind(pb.RewindRequest(sequence=after_rewind + 100, preview=True))
    assert error_reason(refused.value) == "SEQUENCE_AHEAD_OF_LOG", "the same checks as a rewind"


def test_a_rewind_with_nothing_to_abandon_says_so_and_writes_nothing(
    service: InProcessSession,
) -> None:
    stub = service.stub
    create_agent(stub)
    session_id = resolve(stub, **web()).session.session_id
    early = append(stub, session_id, user_message("a")).events[0].sequence
    append(stub, session_id, user_message("b"))
    stub.Rewind(pb.RewindRequest(sequence=early))
    head = append(stub, session_id, user_message("c")).events[0].sequence

    at_head = stub.Rewind(pb.RewindRequest(sequence=head))
    assert (at_head.unchanged, at_head.HasField("record"), at_head.to_sequence) == (
        True,
        False,
        head,
    ), "never an unrelated older record"
    assert at_head.summary == pb.MoveSummary()
    assert _head(stub) == head, "nothing written"
    same = stub.Checkout(pb.CheckoutRequest(sequence=head))
    assert same.unchanged and not same.HasField("record") and _head(stub) == head
    assert _texts(stub, session_id) == ["a", "c"]


_labels = itertools.count()


def _head(stub: pb_grpc.SessionServiceStub) -> int:
    """The log head, read by naming it (a checkpoint names the head; it logs nothing)."""
    label = f"head-{next(_labels)}"
    return int(stub.CreateCheckpoint(pb.CreateCheckpointRequest(label=label)).checkpoint.sequence)


def _texts(stub: pb_grpc.SessionServiceStub, session_id: str) -> list[str]:
    request = pb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
    return [m.message.content for m in stub.GetHistory(request).messages]


def test_migration_4_backfills_the_markers_from_the_rewind_records(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with session_server(loop_thread, database_url) as service:
        stub = service.stub
        create_agent(stub)
        session_id = resolve(stub, **web()).session.session_id
        a = append(stub, session_id, user_message("a")).events[0].sequence
        b = append(stub, session_id, user_message("b"), _temp("b")).events[-1].sequence
        stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=session_id))
        stub.Rewind(pb.RewindRequest(sequence=a))
        append(stub, session_id, user_message("c"), _temp("c"))
        # Undoes the rewind: b is back, c abandoned.
        back = stub.Checkout(pb.CheckoutRequest(sequence=b)).record.sequence
        append(stub, session_id, user_message("d"))
        stub.PutMemory(pb.PutMemoryRequest(agent="main", key="k", value="v"))
        stub.Rewind(pb.RewindRequest(sequence=back))  # abandons d and the memory
        before = _everything(service, session_id)
        markers = _markers(service.unit)
    assert {active for _, _, active in markers} == {True, False}

    backend = open_backend(DatabaseSettings(url=database_url))
    database: Any = backend.database
    with database.connection_context():
        # Back to schema version 3: what migrations 4 and later made, undone.
        _drop_inbound_refs(database)
        _drop_storage_formats(database)
        database.execute_sql("DROP TABLE session_lineage")
        database.execute_sql("DROP TABLE session_version_floor")
        database.execute_sql("DROP TABLE session_shared_setting")
        database.execute_sql("DROP TABLE session_key_report")
        for table in FRAMEWORK_TABLES:  # migration 12
            database.execute_sql(f"DROP TABLE {table}")
        _drop_active_markers(database)
        database.execute_sql(f"DELETE FROM {SESSION_SCHEMA.history_table} WHERE version >= 4")
    database.close()

    with session_server(loop_thread, database_url) as service:
        assert _markers(service.unit) == markers, "backfilled as the moves had marked them"
        timeline = service.unit.store.markers.timeline()
        assert all(timeline.is_active(seq) == active for _, seq, active in markers)
        assert _everything(service, session_id) == before


def _markers(unit: SessionUnit) -> list[tuple[str, int, bool]]:
    database: Any = unit.store.database
    rows = [
        ("log", int(seq), bool(active))
        for seq, active in database.execute_sql(
            "SELECT seq, active FROM session_log ORDER BY seq"
        ).fetchall()
    ]
    rows += [
        ("snapshot", int(seq), bool(active))
        for seq, active in database.execute_sql(
            "SELECT seq, active FROM session_snapshot ORDER BY seq, entity"
        ).fetchall()
    ]
    return rows


def _everything(service: InProcessSession, session_id: str) -> tuple[Any, ...]:
    stub = service.stub
    audit = stub.GetHistory(
        pb.GetHistoryRequest(
            agent="main", session_id=session_id, limit=1000, include_abandoned=True
        )
    ).messages
    return (
        [(m.message.content, m.abandoned) for m in audit],
        _reads(service, session_id),
        dict(stub.GetAgent(pb.GetAgentRequest(name="main")).agent.memory),
    )
