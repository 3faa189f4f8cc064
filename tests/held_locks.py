"""Servers of both services on a database of the test's own, and locks another
connection holds on it: a Postgres `LOCK TABLE … IN ACCESS EXCLUSIVE MODE` on a
private database, a second SQLite connection in `BEGIN EXCLUSIVE`."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import psycopg2
import pytest

from delivery_service.app import DeliveryUnit
from session_service.app import SessionUnit
from session_service.core import SessionLimits
from switchboard.database import DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.server import GrpcApp, ServerSettings
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import EventLoopThread, postgres_unreachable_reason
from tests.pg_faults import private_database

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SERVICES = ["session", "delivery"]
#: The table each service's writes need (SQLite has one lock for the whole file).
LOCKED_TABLE = {"session": "session_log", "delivery": "ledger_obligation"}
#: A lock wait no test may sit out: seeing a call end well before it shows the bound
#: came from somewhere else (the call's deadline).
LONG_WAIT_MS = 30_000


@dataclass
class OwnDatabase:
    """A database of the test's own: a SQLite file, or a private Postgres database."""

    backend: str
    url: str
    path: Path | None = None

    def count(self, table: str) -> int:
        if self.path is not None:
            with closing(sqlite3.connect(self.path)) as database:
                return int(database.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
        connection = psycopg2.connect(self.url, connect_timeout=5)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT COUNT(*) FROM {table}")
                row = cursor.fetchone()
                return int(row[0]) if row else 0
        finally:
            connection.close()

    @contextmanager
    def locked(self, table: str) -> Iterator[None]:
        """Another connection holds the lock `table`'s writers need until the block ends."""
        if self.path is not None:
            with closing(sqlite3.connect(self.path, isolation_level=None)) as holder:
                holder.execute("BEGIN EXCLUSIVE")
                try:
                    yield
                finally:
                    holder.execute("ROLLBACK")
            return
        holder = psycopg2.connect(self.url, connect_timeout=5)
        try:
            with holder.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield
        finally:
            holder.rollback()
            holder.close()


@contextmanager
def own_database(backend: str, tmp_path: Path) -> Iterator[OwnDatabase]:
    """A SQLite file in `tmp_path`, or a private Postgres database (skips without one);
    a test module's fixture parametrized by `BACKENDS` yields it."""
    if backend == "sqlite":
        path = tmp_path / "switchboard.sqlite3"
        yield OwnDatabase("sqlite", f"sqlite:///{path}", path)
        return
    down = postgres_unreachable_reason()
    if down is not None:
        pytest.skip(down)
    with private_database() as db:
        yield OwnDatabase("postgres", db.url)


@dataclass
class Served:
    """A server of one service on the test's database, and one write call of it."""

    app: GrpcApp
    unit: SessionUnit | DeliveryUnit
    channel: grpc.Channel
    #: The write (AppendEvents, RecordObligation) and a fresh request for it.
    method: grpc.UnaryUnaryMultiCallable[Any, Any]
    request: Callable[[], Any]
    #: The table that write adds a row to.
    table: str

    def write(self, timeout: float | None) -> Any:
        """One write; `timeout` is the call's deadline."""
        return self.method(self.request(), timeout=timeout)

    def start_write(self) -> grpc.Future[Any]:
        """One write, not waited for (it can be cancelled)."""
        future: grpc.Future[Any] = self.method.future(self.request())
        return future


#: A write method and what makes a request for it (the stubs' generics exist for typing only).
Writer: TypeAlias = "tuple[grpc.UnaryUnaryMultiCallable[Any, Any], Callable[[], Any]]"


def _session_writer(channel: grpc.Channel) -> Writer:
    stub = spb_grpc.SessionServiceStub(channel)
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
    session = stub.ResolveSession(
        spb.ResolveSessionRequest(
            agent="main", source=spb.Source(transport="web", conversation_id="tab")
        )
    ).session.session_id
    message = spb.Message(role=spb.ROLE_USER, content="hello")
    request = spb.AppendEventsRequest(
        agent="main",
        session_id=session,
        events=[spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))],
    )
    return stub.AppendEvents, lambda: request


def _delivery_writer(channel: grpc.Channel) -> Writer:
    stub = dpb_grpc.DeliveryServiceStub(channel)
    instance = stub.RegisterInstance(
        dpb.RegisterInstanceRequest(gateway_name="g", host="h", pid=1, platforms=["slack"])
    ).instance.instance_id

    def request() -> dpb.RecordObligationRequest:
        return dpb.RecordObligationRequest(
            instance_id=instance,
            content="the answer",
            session_key="agent:main:slack:channel:C1",
            message_ref=uuid.uuid4().hex,
            platform="slack",
            chat_id="C1",
        )

    return stub.RecordObligation, request


@contextmanager
def served(
    loop: EventLoopThread, service: str, db: OwnDatabase, lock_wait_ms: int, **settings: Any
) -> Iterator[Served]:
    database = DatabaseSettings(url=db.url, busy_timeout_ms=lock_wait_ms)
    unit: SessionUnit | DeliveryUnit = (
        SessionUnit(database, SessionLimits(watch_poll_s=0.2))
        if service == "session"
        else DeliveryUnit(database)
    )
    app = GrpcApp(unit, ServerSettings(listen="127.0.0.1:0", drain_grace_s=1.0, **settings))
    loop.run(app.start())
    channel = grpc.insecure_channel(app.address)
    try:
        writer = _session_writer if service == "session" else _delivery_writer
        method, request = writer(channel)
        yield Served(app, unit, channel, method, request, LOCKED_TABLE[service])
    finally:
        channel.close()
        loop.run(app.stop())


def waiting_on_locks(url: str, calls_only: bool = False) -> int:
    """Database sessions waiting for a lock; `calls_only`: not counting the health
    probe's own lock check (a LOCK TABLE), which waits on a held lock too."""
    probes = " AND query NOT LIKE '%LOCK TABLE%'" if calls_only else ""
    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'" + probes
            )
            row = cursor.fetchone()
            return int(row[0]) if row else 0
    finally:
        connection.close()


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
