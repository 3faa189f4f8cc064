"""Locks another connection holds, and statements the database cancels, through real
servers of both services on both backends: a Postgres `LOCK TABLE … IN ACCESS
EXCLUSIVE MODE` on a private database, a second SQLite connection in `BEGIN EXCLUSIVE`.

A call that cannot get its lock answers UNAVAILABLE (or DEADLINE_EXCEEDED once its
deadline has passed, and the server stops waiting then too), never INTERNAL, with one
warning line and no traceback; it writes nothing; health says NOT_SERVING while writes
cannot take their locks and SERVING once they can. The same lock under load, against
server processes, is in `tests/test_lock_red_team.py`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from delivery_service.app import DeliveryUnit
from session_service.app import SessionUnit
from switchboard.log_budget import LOG_LINES
from tests.harness import EventLoopThread, postgres_unreachable_reason
from tests.held_locks import (
    BACKENDS,
    LONG_WAIT_MS,
    SERVICES,
    OwnDatabase,
    own_database,
    served,
    wait_for,
    waiting_on_locks,
)
from tests.pg_faults import private_database, wait_for_health
from tests.status import error_reason

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=BACKENDS)
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OwnDatabase]:
    with own_database(request.param, tmp_path) as db:
        yield db


def refused(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def gave_up_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "switchboard.runner"]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with_traceback = [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]
    assert not with_traceback, with_traceback


def assert_no_internal(caplog: pytest.LogCaptureFixture) -> None:
    internal = [r for r in caplog.records if getattr(r, "status", "") == "INTERNAL"]
    assert not internal, [r.getMessage() for r in internal]


@pytest.mark.parametrize("service", SERVICES)
def test_a_lock_held_past_the_wait_allowed_answers_unavailable_with_one_line_each(
    loop_thread: EventLoopThread,
    database: OwnDatabase,
    service: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Calls without a deadline wait --db-lock-timeout (here 0.2 s), then answer
    UNAVAILABLE with a reason and a message saying what to do; a flood of them logs
    at most the budget's lines, none with a traceback, and writes nothing."""
    calls = LOG_LINES + 3
    with (
        caplog.at_level(logging.INFO),
        served(loop_thread, service, database, lock_wait_ms=200) as server,
    ):
        before = database.count(server.table)
        with database.locked(server.table):
            errors = [refused(lambda: server.write(None)) for _ in range(calls)]
        server.write(None)  # the lock is gone: writes pass again
    assert {error.code() for error in errors} == {grpc.StatusCode.UNAVAILABLE}, errors
    reason = {"sqlite": "DATABASE_LOCKED", "postgres": "DATABASE_LOCK_TIMEOUT"}
    assert {error_reason(error) for error in errors} == {reason[database.backend]}
    assert all("--db-lock-timeout" in str(error.details()) for error in errors), errors[0]
    assert database.count(server.table) == before + 1, "a refused call wrote something"
    lines = gave_up_lines(caplog)
    assert 0 < len(lines) <= LOG_LINES < calls, [r.getMessage() for r in lines]
    assert all(r.levelno == logging.WARNING and "\n" not in r.getMessage() for r in lines)
    assert_no_traceback(caplog)
    assert_no_internal(caplog)


@pytest.mark.parametrize("service", SERVICES)
def test_a_call_never_waits_on_a_lock_past_its_deadline(
    loop_thread: EventLoopThread,
    database: OwnDatabase,
    service: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The server's bound is 30 s, the call's deadline 1 s: the server stops waiting
    at the deadline (its statement gives up while the lock is still held) and logs
    and counts the call DEADLINE_EXCEEDED."""
    with (
        caplog.at_level(logging.INFO),
        served(loop_thread, service, database, lock_wait_ms=LONG_WAIT_MS) as server,
        database.locked(server.table),
    ):
        error = refused(lambda: server.write(1.0))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error
        # Well inside the 30 s bound, and while the lock is still held.
        wait_for(lambda: gave_up_lines(caplog), "the server's statement to stop waiting")
        if database.backend == "postgres":
            wait_for(lambda: waiting_on_locks(database.url) == 0, "no waiting statement")
    statuses = [getattr(r, "status", "") for r in caplog.records if r.name == "switchboard.access"]
    assert statuses[-1] == "DEADLINE_EXCEEDED", statuses
    assert_no_traceback(caplog)
    assert_no_internal(caplog)


@pytest.mark.postgres
@pytest.mark.parametrize("service", SERVICES)
def test_a_database_statement_timeout_answers_unavailable(
    loop_thread: EventLoopThread, service: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A statement_timeout set on the database (ALTER DATABASE) cancels a statement
    waiting on the lock before the server's own bound: UNAVAILABLE, not INTERNAL."""
    down = postgres_unreachable_reason()
    if down is not None:
        pytest.skip(down)
    with private_database() as db:
        db.sql(f'ALTER DATABASE "{db.name}" SET statement_timeout = 300')
        own = OwnDatabase("postgres", db.url)
        with (
            caplog.at_level(logging.INFO),
            served(loop_thread, service, own, lock_wait_ms=LONG_WAIT_MS) as server,
        ):
            before = own.count(server.table)
            with own.locked(server.table):
                error = refused(lambda: server.write(None))
            assert own.count(server.table) == before, "the cancelled call wrote something"
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert error_reason(error) == "DATABASE_STATEMENT_TIMEOUT"
    assert "statement_timeout" in str(error.details()), error.details()
    assert_no_traceback(caplog)
    assert_no_internal(caplog)


@pytest.mark.parametrize("service", SERVICES)
def test_health_is_not_serving_while_writes_cannot_take_their_locks(
    loop_thread: EventLoopThread, database: OwnDatabase, service: str
) -> None:
    names = ("", SessionUnit.service_name if service == "session" else DeliveryUnit.service_name)
    with served(loop_thread, service, database, lock_wait_ms=LONG_WAIT_MS) as server:
        address = server.app.address
        wait_for_health(address, names, "SERVING", 10)
        with database.locked(server.table):
            wait_for_health(address, names, "NOT_SERVING", 15)
        wait_for_health(address, names, "SERVING", 15)
        server.write(None)


@pytest.mark.parametrize("service", SERVICES)
def test_the_servers_own_writes_holding_the_lock_keep_health_serving(
    loop_thread: EventLoopThread, database: OwnDatabase, service: str
) -> None:
    """On SQLite the server's own writer holds the file's one write lock while it
    commits: writes queued back to back (three threads, 0.2 s each, so the lock is
    free only between two group commits) are progress, not a database that cannot
    serve, though the probe's own try for the lock times out."""
    with served(loop_thread, service, database, lock_wait_ms=LONG_WAIT_MS) as server:
        stop = threading.Event()
        runner = server.unit.runner

        def slow_writes() -> None:
            while not stop.is_set():
                runner.submit_write(lambda _now: time.sleep(0.2)).result(timeout=30)

        writers = [threading.Thread(target=slow_writes, daemon=True) for _ in range(3)]
        for writer in writers:
            writer.start()
        try:
            for _ in range(3):
                server.unit.probe()  # raises while the database cannot serve
        finally:
            stop.set()
            for writer in writers:
                writer.join(timeout=30)
