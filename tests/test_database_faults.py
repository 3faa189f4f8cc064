"""Database faults on real PostgreSQL, against in-process servers: connections
terminated under load, a call queued past its deadline, a black-holed network,
and the round trips each call costs.

Each test has a database of its own (`tests.pg_faults.private_database`), so
terminating its connections touches no other test. The restart and the outage run
against server processes in `tests/test_database_outages.py`.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
import psycopg2
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from tests.harness import (
    EventLoopThread,
    Gateway,
    delivery_server,
    postgres_unreachable_reason,
    session_server,
)
from tests.pg_faults import Load, PrivateDatabase, appender, private_database, wait_for_health
from tests.status import error_reason
from tests.tcp_proxy import Link, ReplyCounter, TcpProxy

_DOWN = postgres_unreachable_reason()
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(_DOWN is not None, reason=_DOWN or ""),
    pytest.mark.timeout(120),
]

CALL_TIMEOUT_S = 10.0
SESSION_NAMES = ("", "switchboard.session.v1.SessionService")


def _record_request(instance_id: str, ref: str) -> dpb.RecordObligationRequest:
    return dpb.RecordObligationRequest(
        instance_id=instance_id,
        content="the answer",
        session_key=f"agent:main:slack:channel:{ref}",
        message_ref=ref,
        platform="slack",
        chat_id="C1",
        thread_id="1.0",
    )


def _recorder(stub: dpb_grpc.DeliveryServiceStub, threads: int, tag: str) -> Any:
    gateways = [Gateway(stub) for _ in range(threads)]

    def record(index: int, n: int) -> str:
        request = _record_request(gateways[index].instance_id, f"{tag}-{index}-{n}")
        return stub.RecordObligation(request, timeout=CALL_TIMEOUT_S).obligation.id

    return record


def _assert_all_stored(db: PrivateDatabase, appends: Load, obligations: Load | None) -> None:
    logged = {row[0] for row in db.sql("SELECT seq FROM session_log")}
    missing_appends = [seq for seq in appends.acknowledged if seq not in logged]
    assert not missing_appends, f"acknowledged appends lost: {missing_appends[:10]}"
    if obligations is not None:
        stored = {row[0] for row in db.sql("SELECT id FROM ledger_obligation")}
        missing = [oid for oid in obligations.acknowledged if oid not in stored]
        assert not missing, f"acknowledged obligations lost: {missing[:10]}"


def test_terminated_connections_answer_unavailable_and_lose_nothing(
    loop_thread: EventLoopThread,
) -> None:
    """pg_terminate_backend on every connection, three times, under appends and
    obligations from several threads: each call answers OK or UNAVAILABLE, the
    service recovers without a restart, and nothing acknowledged is lost."""
    with (
        private_database() as db,
        delivery_server(loop_thread, db.url) as delivery,
        session_server(loop_thread, db.url) as sessions,
    ):
        record = _recorder(delivery.stub, 3, "kill")
        append = appender(sessions.stub, 3, CALL_TIMEOUT_S)
        recoveries: list[float] = []
        with Load(record, threads=3) as obligations, Load(append, threads=3) as appends:
            for _ in range(3):
                seen = obligations.ok_count(), appends.ok_count()
                _wait(
                    lambda s=seen: (
                        obligations.ok_count() >= s[0] + 10 and appends.ok_count() >= s[1] + 10
                    ),
                    "calls between kills",
                )
                killed_at = time.monotonic()
                assert db.terminate_backends() > 0, "the servers held no connection to cut"
                recoveries.append(
                    max(
                        obligations.wait_for_ok_after(killed_at),
                        appends.wait_for_ok_after(killed_at),
                    )
                )
        print(
            f"recovery after pg_terminate_backend: {', '.join(f'{r:.3f}' for r in recoveries)} s;"
            f" appends {dict(appends.codes)}, obligations {dict(obligations.codes)}"
        )
        for load in (appends, obligations):
            assert set(load.codes) <= {"OK", "UNAVAILABLE"}, load.codes
        _assert_all_stored(db, appends, obligations)


def test_a_call_whose_deadline_passed_in_the_write_queue_is_not_executed(
    loop_thread: EventLoopThread,
) -> None:
    """Every writer thread waits on a lock held by another connection (SHARE: writes
    wait, reads do not, so the waiters are writers); a call with a
    one-second deadline queues behind them. When the lock goes, it is not executed."""
    with private_database() as db, delivery_server(loop_thread, db.url) as delivery:
        gateway = Gateway(delivery.stub)
        gateway.record(message_ref="warm-up")
        locker = psycopg2.connect(db.url)
        try:
            with locker.cursor() as cursor:
                cursor.execute("LOCK TABLE ledger_obligation IN SHARE MODE")
            blocked = []
            writers = delivery.unit.runner.backend.writer_threads
            for index in range(writers):
                request = _record_request(gateway.instance_id, f"blocked-{index}")
                blocked.append(delivery.stub.RecordObligation.future(request, timeout=60))
                _wait(lambda n=index + 1: db.waiting_on_locks() >= n, "a writer waiting")
            late = delivery.stub.RecordObligation.future(
                _record_request(gateway.instance_id, "late"), timeout=1.0
            )
            with pytest.raises(grpc.RpcError) as left:
                late.result()
            assert left.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            time.sleep(0.5)  # the server's view of the deadline may trail the client's a little
        finally:
            locker.rollback()
            locker.close()
        for call in blocked:
            call.result()
        gateway.record(message_ref="after")  # queued after the late call: it had its turn
        time.sleep(0.5)  # any writer still busy with the late call would finish meanwhile
        refs = {row[0] for row in db.sql("SELECT message_ref FROM ledger_obligation")}
        assert {"blocked-0", "after"} <= refs
        assert "late" not in refs, "a call whose caller had left was executed"


def test_a_black_holed_database_is_survived(loop_thread: EventLoopThread) -> None:
    """20 s in which the network to Postgres carries nothing: calls fail
    (UNAVAILABLE or DEADLINE_EXCEEDED, never INTERNAL), health says NOT_SERVING; then
    everything works again without a restart and nothing acknowledged is lost."""
    with (
        private_database() as db,
        TcpProxy(("127.0.0.1", 5432)) as proxy,
        session_server(loop_thread, db.url.replace("127.0.0.1:5432", proxy.address)) as srv,
    ):
        append = appender(srv.stub, 4, timeout_s=2.0)
        with Load(append, threads=4) as appends:
            _wait(lambda: appends.ok_count() >= 20, "appends before the black hole")
            proxy.blackhole = True
            wait_for_health(srv.address, SESSION_NAMES, "NOT_SERVING", 15)
            time.sleep(20)
            proxy.blackhole = False
            back = time.monotonic()
            ok_after = appends.wait_for_ok_after(back, timeout_s=30)
            serving_after = wait_for_health(srv.address, SESSION_NAMES, "SERVING", 30)
            _wait(lambda: appends.first_ok_after(back + 2) is not None, "appends afterwards")
        print(
            f"black hole 20 s: first append OK {ok_after:.2f} s after it ended, SERVING after "
            f"{serving_after:.2f} s; codes {dict(appends.codes)}"
        )
        assert set(appends.codes) <= {"OK", "UNAVAILABLE", "DEADLINE_EXCEEDED"}, appends.codes
        _assert_all_stored(db, appends, None)


def test_round_trips_per_call(loop_thread: EventLoopThread) -> None:
    """Round trips to Postgres per call, counted at a proxy: an append costs 3 (the log
    lock travels with the session row's read, then the head, then its INSERT and
    projection upsert travel with the COMMIT; it was 9, then 4), RecordObligation,
    MarkAttempting and MarkDelivered 2 each (they were 4): BEGIN and savepoints travel
    with the next statement, "now" is not a query, the pool does not ping at check-out."""
    replies = ReplyCounter()
    with private_database() as db, TcpProxy(("127.0.0.1", 5432)) as proxy:
        proxy.on_reply = replies
        url = db.url.replace("127.0.0.1:5432", proxy.address)
        quiet = 3600.0  # no health probes between the counted calls
        with session_server(loop_thread, url, health_probe_interval_s=quiet) as sessions:
            append = appender(sessions.stub, 1, CALL_TIMEOUT_S)
            append(0, 0)
            appends = replies.per_call(20, lambda n: append(0, n))
        with delivery_server(loop_thread, url, health_probe_interval_s=quiet) as delivery:
            gateway = Gateway(delivery.stub)
            gateway.record(message_ref="warm-up")
            rows: list[dpb.Obligation] = []
            records = replies.per_call(
                20, lambda n: rows.append(gateway.record(message_ref=f"m{n}").obligation)
            )
            attempting = [gateway.attempting(row) for row in rows[:1]]
            marks = replies.per_call(
                19, lambda n: attempting.append(gateway.attempting(rows[n + 1]))
            )
            delivered = replies.per_call(20, lambda n: gateway.delivered(attempting[n]))
    print(
        f"round trips per call: AppendEvents {appends:.2f}, RecordObligation {records:.2f}, "
        f"MarkAttempting {marks:.2f}, MarkDelivered {delivered:.2f}"
    )
    assert appends <= 3.5
    assert max(records, marks, delivered) <= 2.5


def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_commit_whose_answer_is_lost_answers_unavailable(loop_thread: EventLoopThread) -> None:
    """The connection drops after Postgres committed but before its answer arrived: the
    call cannot know it committed, so it answers UNAVAILABLE (retry with the same
    request id), never INTERNAL, and is not run a second time by the server."""
    with private_database() as db, TcpProxy(("127.0.0.1", 5432)) as proxy:
        url = db.url.replace("127.0.0.1:5432", proxy.address)
        with delivery_server(loop_thread, url) as delivery:
            gateway = Gateway(delivery.stub)
            dropped: list[Link] = []

            def lose_the_commit_answer(link: Link, data: bytes) -> bool:
                if not dropped and b"COMMIT\x00" in data:
                    dropped.append(link)
                    return False
                return True

            proxy.on_reply = lose_the_commit_answer
            with pytest.raises(grpc.RpcError) as lost:
                gateway.record(message_ref="lost-answer")
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(lost.value) == "DATABASE_CONNECTION_LOST"
            assert "may or may not" in (lost.value.details() or "")
            gateway.record(message_ref="next")  # the service goes on, on a fresh connection
        refs = [row[0] for row in db.sql("SELECT message_ref FROM ledger_obligation")]
        assert refs.count("lost-answer") == 1, (
            "committed once, though the caller was told it failed"
        )


def test_operations_run_in_the_submitting_calls_context(tmp_path: Any) -> None:
    """Per-call context (request ids, deadlines) set before submitting is visible inside."""
    from contextvars import ContextVar

    from switchboard.backends import open_backend
    from switchboard.database import DatabaseSettings
    from switchboard.runner import TransactionRunner

    request_id: ContextVar[str] = ContextVar("request_id", default="")
    settings = DatabaseSettings(url=f"sqlite:///{tmp_path / 'context.sqlite3'}")
    runner = TransactionRunner(open_backend(settings), settings)
    try:
        request_id.set("r-1")
        assert runner.submit_write(lambda now: request_id.get()).result(timeout=10) == "r-1"
        assert runner.submit_read(request_id.get).result(timeout=10) == "r-1"
    finally:
        runner.close()
