"""WatchEvents as a fan-out: many watchers, slow watchers ended with a resume point,
the watcher cap, and cross-replica delivery by LISTEN/NOTIFY on Postgres."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import (
    EventLoopThread,
    InProcessSession,
    postgres_unreachable_reason,
    session_server,
)
from tests.pg_faults import PrivateDatabase, private_database
from tests.session.conftest import StartSession, append, create_agent, resolve, user_message, web

WATCHERS = 500
APPENDS = 20


def _error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    status = rpc_status.from_call(error)
    assert status is not None, error
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return info
    raise AssertionError(f"no ErrorInfo in {error}")


def test_hundreds_of_watchers_get_every_event_once_in_order(service: InProcessSession) -> None:
    create_agent(service.stub)
    session = resolve(service.stub, **web()).session
    other = resolve(service.stub, **web("tab-2")).session.session_id
    start = session.last_sequence

    def appending() -> None:
        for n in range(APPENDS):
            append(service.stub, session.session_id, user_message(f"m{n}"))
            append(service.stub, other, user_message(f"noise {n}"))

    async def watch_all() -> list[list[str]]:
        async with grpc.aio.insecure_channel(service.address) as channel:
            stub = pb_grpc.SessionServiceStub(channel)

            async def one(index: int) -> list[str]:
                # Half follow one session, half everything; some start in the past (catch-up).
                request = pb.WatchEventsRequest(after_sequence=0 if index % 7 == 0 else start)
                if index % 2:
                    request.session_id = session.session_id
                stream = stub.WatchEvents(request, timeout=60)
                seen: list[str] = []
                async for item in stream:
                    event = item.event
                    if event.session_id == session.session_id and event.sequence > start:
                        seen.append(event.message_appended.message.content)
                    if len(seen) == APPENDS:
                        break
                stream.cancel()
                return seen

            watchers = [asyncio.create_task(one(i)) for i in range(WATCHERS)]
            await asyncio.sleep(1.0)
            writer = threading.Thread(target=appending)
            writer.start()
            results = await asyncio.gather(*watchers)
            writer.join()
            return results

    expected = [f"m{n}" for n in range(APPENDS)]
    assert asyncio.run(watch_all()) == [expected] * WATCHERS


def test_a_slow_watcher_is_ended_with_its_resume_point_and_loses_nothing(
    start_session: StartSession,
) -> None:
    service = start_session(
        SessionLimits(watch_poll_s=0.2, watch_queue_events=4, watch_queue_bytes=1024 * 1024)
    )
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    head = append(service.stub, session_id, user_message("first")).events[-1].sequence
    big = "x" * (200 * 1024)
    stream = service.stub.WatchEvents(
        pb.WatchEventsRequest(session_id=session_id, after_sequence=head - 1), timeout=60
    )
    assert next(stream).event.message_appended.message.content == "first"
    # The watcher reads nothing while 60 events of 200 KiB (12 MB) commit: far past
    # what the client's and the server's transport buffers hold, and its 1 MiB queue.
    sequences = [
        append(service.stub, session_id, user_message(f"{n}:{big}")).events[-1].sequence
        for n in range(60)
    ]
    received: list[int] = []
    with pytest.raises(grpc.RpcError) as ended:
        for item in stream:
            received.append(item.event.sequence)
    assert ended.value.code() == grpc.StatusCode.ABORTED
    info = _error_info(ended.value)
    assert info.reason == "WATCHER_TOO_SLOW"
    resume = int(info.metadata["resume_after_sequence"])
    assert received == list(range(head + 1, resume + 1)), "what came before the end has no gap"
    assert resume < sequences[-1], "the watcher was ended before it had everything"
    again = service.stub.WatchEvents(
        pb.WatchEventsRequest(session_id=session_id, after_sequence=resume), timeout=60
    )
    rest = []
    for item in again:
        rest.append(item.event.sequence)
        if item.event.sequence == sequences[-1]:
            again.cancel()
            break
    assert received + rest == sequences


def test_the_watcher_cap_leaves_unary_calls_and_health_alone(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    limits = SessionLimits(watch_poll_s=0.2, max_watchers=2)
    with session_server(loop_thread, database_url, limits, max_concurrent_rpcs=2) as service:
        create_agent(service.stub)
        streams = [service.stub.WatchEvents(pb.WatchEventsRequest(), timeout=30) for _ in range(2)]
        for stream in streams:
            assert next(stream).event.HasField("agent_created"), "both streams are running"
        with pytest.raises(grpc.RpcError) as refused:
            next(service.stub.WatchEvents(pb.WatchEventsRequest(), timeout=30))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-watchers" in (refused.value.details() or "")
        assert _error_info(refused.value).reason == "TOO_MANY_WATCHERS"
        # Two watchers fill neither --max-concurrent-rpcs 2 nor the health probe.
        assert service.stub.GetAgent(pb.GetAgentRequest(name="main")).agent.name == "main"
        health = health_pb2_grpc.HealthStub(service.channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        for stream in streams:
            stream.cancel()


def test_health_watch_streams_the_status_and_its_changes(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with session_server(loop_thread, database_url) as service:
        health = health_pb2_grpc.HealthStub(service.channel)
        stream = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        unknown = health.Watch(health_pb2.HealthCheckRequest(service="no.Such"), timeout=30)
        assert next(unknown).status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        unknown.cancel()
        loop_thread.run(service.app._set_health(False))
        assert next(stream).status == health_pb2.HealthCheckResponse.NOT_SERVING
        loop_thread.run(service.app._set_health(True))
        assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
        stream.cancel()


@pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_watcher_on_another_replica_hears_of_appends_by_notify(
    database_url: str, start_session: StartSession
) -> None:
    """LISTEN/NOTIFY is Postgres': this test has no SQLite half (rather than skipping it)."""
    # Polling once a minute: within the stream's 30 s only a notification can wake B.
    limits = SessionLimits(watch_poll_s=60.0)
    replica_a, replica_b = start_session(limits), start_session(limits)
    create_agent(replica_a.stub)
    session = resolve(replica_a.stub, **web()).session
    stream = replica_b.stub.WatchEvents(
        pb.WatchEventsRequest(session_id=session.session_id, after_sequence=session.last_sequence),
        timeout=30,
    )
    sent = [append(replica_a.stub, session.session_id, user_message(f"m{n}")) for n in range(3)]
    seen = []
    for item in stream:
        seen.append(item.event.sequence)
        if len(seen) == len(sent):
            break
    stream.cancel()
    assert seen == [answer.events[-1].sequence for answer in sent]


def _listening_backends(db: PrivateDatabase) -> set[int]:
    """The pids of the connections to `db` whose last statement was a LISTEN."""
    rows = db.sql(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND query LIKE 'LISTEN %%'",
        (db.name,),
    )
    return {int(row[0]) for row in rows}


def _wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """Whether `condition` came true within `timeout_s` (checked every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _append_through_faults(stub: pb_grpc.SessionServiceStub, session_id: str, text: str) -> int:
    """An append retried while the database fault still answers UNAVAILABLE (nothing
    written then); the sequence it was given."""
    for _ in range(50):
        try:
            return append(stub, session_id, user_message(text)).events[-1].sequence
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.1)
    raise AssertionError(f"appending {text!r} stayed UNAVAILABLE")


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_the_listen_connection_recovers_after_a_database_fault(
    loop_thread: EventLoopThread,
) -> None:
    """pg_terminate_backend cuts every connection, B's LISTEN one too: B reconnects it,
    and its watcher still hears of A's appends by NOTIFY."""
    down = postgres_unreachable_reason()
    if down:
        pytest.skip(down)
    # Polling once a minute: within the stream's deadline only a notification wakes B.
    limits = SessionLimits(watch_poll_s=60.0)
    with (
        private_database() as db,  # of its own: terminating its connections harms no other test
        session_server(loop_thread, db.url, limits) as replica_a,
        session_server(loop_thread, db.url, limits) as replica_b,
    ):
        create_agent(replica_a.stub)
        session = resolve(replica_a.stub, **web()).session
        stream = replica_b.stub.WatchEvents(
            pb.WatchEventsRequest(
                session_id=session.session_id, after_sequence=session.last_sequence
            ),
            timeout=30,
        )
        before = _append_through_faults(replica_a.stub, session.session_id, "before")
        assert next(stream).event.sequence == before, "B hears by NOTIFY before the fault"
        listening = _listening_backends(db)
        assert len(listening) == 1, "B alone has a watcher, so B alone listens"

        assert db.terminate_backends() > 0
        # Appends made before B listens again would reach it by the read that follows a
        # reconnection; after it, only a NOTIFY can. (Without a reconnection the appends
        # go ahead anyway, so that what fails is the delivery.)
        back = _wait_until(lambda: bool(_listening_backends(db) - listening), timeout_s=10.0)
        sent = [
            _append_through_faults(replica_a.stub, session.session_id, f"m{n}") for n in range(3)
        ]
        seen: list[int] = []
        try:
            for item in stream:
                seen.append(item.event.sequence)
                if len(seen) == len(sent):
                    break
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
            pytest.fail(f"B heard {seen} of A's appends {sent} (LISTEN connection back: {back})")
        stream.cancel()
        assert seen == sent


def test_watching_past_the_head_waits_until_the_log_passes_it(service: InProcessSession) -> None:
    create_agent(service.stub)
    session_id = resolve(service.stub, **web()).session.session_id
    head = append(service.stub, session_id, user_message("seen")).events[-1].sequence
    stream = service.stub.WatchEvents(pb.WatchEventsRequest(after_sequence=head + 3), timeout=30)
    first: list[int] = []
    reader = threading.Thread(target=lambda: first.append(next(stream).event.sequence))
    reader.start()
    # Registered before the log reaches `after_sequence`: a watcher that joined later
    # would catch up from it and prove nothing.
    watching = service.unit.core.watching
    assert _wait_until(lambda: bool(watching._watchers), timeout_s=10.0)
    said_seen = [
        append(service.stub, session_id, user_message(f"before {n}")).events[-1].sequence
        for n in range(3)
    ]
    assert said_seen == [head + 1, head + 2, head + 3]
    after = append(service.stub, session_id, user_message("after")).events[-1].sequence
    reader.join(timeout=30)
    stream.cancel()
    assert first == [after], "an event at or below after_sequence was sent"
