"""Calls their callers end are logged and counted as the caller saw them, never INTERNAL:
a stream cancelled after its first answer (a closed browser tab), a stream abandoned at
its deadline, a unary call abandoned at its deadline and one cancelled while it waits
(on a lock another connection holds), on both services and both backends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from switchboard.observability import RpcMetrics
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import EventLoopThread
from tests.held_locks import (
    BACKENDS,
    LONG_WAIT_MS,
    SERVICES,
    OwnDatabase,
    Served,
    own_database,
    served,
    wait_for,
    waiting_on_locks,
)

pytestmark = pytest.mark.timeout(120)

#: The streaming call of each service's server: the SessionService's watch, and the
#: health watch beside the DeliveryService (which has no streaming method of its own).
STREAM = {
    "session": "/switchboard.session.v1.SessionService/WatchEvents",
    "delivery": "/grpc.health.v1.Health/Watch",
}
WRITE = {
    "session": "/switchboard.session.v1.SessionService/AppendEvents",
    "delivery": "/switchboard.delivery.v1.DeliveryService/RecordObligation",
}


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OwnDatabase]:
    with own_database(request.param, tmp_path) as db:
        yield db


def _stream_opener(service: str, channel: grpc.Channel) -> Callable[[float | None], Any]:
    """Opens the service's stream; its first answer comes at once (an event written
    before, the current health status)."""
    if service == "session":
        watch = spb_grpc.SessionServiceStub(channel).WatchEvents
        return lambda timeout: watch(spb.WatchEventsRequest(), timeout=timeout)
    health = health_pb2_grpc.HealthStub(channel).Watch
    return lambda timeout: health(health_pb2.HealthCheckRequest(), timeout=timeout)


def _counted(registry: CollectorRegistry, method: str, code: str) -> float:
    value = registry.get_sample_value("switchboard_rpc_total", {"method": method, "code": code})
    return value or 0.0


def _end_a_unary_call_of_each_kind(server: Served, database: OwnDatabase, caplog: Any) -> None:
    """Under a held lock: one write abandoned at its 1 s deadline, then one cancelled
    once the server is waiting on the lock for it."""
    with database.locked(server.table):
        with pytest.raises(grpc.RpcError) as abandoned:
            server.write(1.0)
        assert abandoned.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: any(r.name == "switchboard.runner" for r in caplog.records), "give-up")
        cancelled = server.start_write()
        if database.backend == "postgres":
            wait_for(lambda: waiting_on_locks(database.url, calls_only=True) > 0, "the write")
        else:
            time.sleep(1.0)  # SQLite tells nobody who waits for its lock: give it time
        assert cancelled.cancel(), "the call ended before it was cancelled"
        # Held until the server has seen the cancel: released at once, the write could
        # commit and answer OK before the cancel reaches the server.
        wait_for(lambda: _logged(caplog, "CANCELLED"), "the server to see the cancel")


def _logged(caplog: Any, status: str) -> bool:
    """Whether the access log has a write ended with `status`."""
    return any(
        r.name == "switchboard.access"
        and f" {status} " in r.getMessage()
        and "Watch" not in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.parametrize("service", SERVICES)
def test_calls_their_callers_end_count_as_what_the_caller_saw(
    loop_thread: EventLoopThread,
    database: OwnDatabase,
    service: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    with (
        caplog.at_level(logging.INFO),
        served(
            loop_thread, service, database, LONG_WAIT_MS, metrics=RpcMetrics(registry)
        ) as server,
    ):
        server.write(None)  # an event for the watch to send
        open_stream = _stream_opener(service, server.channel)
        closed_tab = open_stream(None)
        next(closed_tab)
        closed_tab.cancel()
        timed_out = open_stream(1.0)
        next(timed_out)
        with pytest.raises(grpc.RpcError) as deadline:
            for _ in timed_out:
                pass
        assert deadline.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        _end_a_unary_call_of_each_kind(server, database, caplog)
        expected = {
            (STREAM[service], "CANCELLED"): 1.0,
            (STREAM[service], "DEADLINE_EXCEEDED"): 1.0,
            (WRITE[service], "CANCELLED"): 1.0,
            (WRITE[service], "DEADLINE_EXCEEDED"): 1.0,
        }

        def counts() -> dict[tuple[str, str], float]:
            return {key: _counted(registry, *key) for key in expected}

        # Long: the cancelled write is counted only once it gives up its lock wait,
        # which a loaded machine may take a while to schedule.
        wait_for(lambda: counts() == expected, f"the counts {expected}", timeout_s=60)
    exposed = generate_latest(registry).decode()
    assert 'code="INTERNAL"' not in exposed, exposed
    lines = {
        (r.method, r.status)  # type: ignore[attr-defined]
        for r in caplog.records
        if r.name == "switchboard.access"
    }
    assert set(expected) <= lines, lines
    assert not [line for line in lines if line[1] == "INTERNAL"], lines
