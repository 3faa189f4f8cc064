"""Database faults for tests, on real PostgreSQL, never touching other tests' data.

- `private_database()`: a database of the test's own on the main cluster
  (`sb_fault_<uuid>`), dropped WITH (FORCE) afterwards; `terminate_backends` cuts
  its connections, `refuse_connections` takes it away (ALLOW_CONNECTIONS false
  plus terminating) until it is given back.
- `private_cluster()`: a PostgreSQL cluster of the test's own on another port, for
  a real server restart (`pg_ctlcluster … restart -m fast`); dropped afterwards.
- `Load`: threads calling the services in a loop, keeping what was acknowledged
  and every status code seen, so a test can check that nothing acknowledged is
  lost and no call answered anything but OK or UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import grpc
import psycopg2
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import POSTGRES_URL

PG_VERSION = "15"


def _admin(url: str = POSTGRES_URL) -> Any:
    connection = psycopg2.connect(url, connect_timeout=5)
    connection.autocommit = True
    return connection


def _with_database(url: str, name: str) -> str:
    parsed = urlparse(url)
    return parsed._replace(path=f"/{name}", query="").geturl()


@dataclass
class PrivateDatabase:
    name: str
    url: str
    admin_url: str

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Runs `statement` in this database on a connection of its own."""
        connection = psycopg2.connect(self.url, connect_timeout=5)
        try:
            with connection, connection.cursor() as cursor:
                cursor.execute(statement, params)
                return list(cursor.fetchall()) if cursor.description else []
        finally:
            connection.close()

    def terminate_backends(self) -> int:
        """pg_terminate_backend on every connection to this database; returns how many."""
        admin = _admin(self.admin_url)
        try:
            with admin.cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (self.name,),
                )
                row = cursor.fetchone()
                return int(row[0]) if row else 0
        finally:
            admin.close()

    def refuse_connections(self, refuse: bool = True) -> None:
        """Takes the database away (no new connections, current ones cut), or gives it back."""
        admin = _admin(self.admin_url)
        try:
            with admin.cursor() as cursor:
                cursor.execute(
                    f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS {str(not refuse).lower()}'
                )
        finally:
            admin.close()
        if refuse:
            self.terminate_backends()

    def waiting_on_locks(self) -> int:
        admin = _admin(self.admin_url)
        try:
            with admin.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = %s AND wait_event_type = 'Lock'",
                    (self.name,),
                )
                row = cursor.fetchone()
                return int(row[0]) if row else 0
        finally:
            admin.close()


@contextlib.contextmanager
def private_database(admin_url: str = POSTGRES_URL) -> Iterator[PrivateDatabase]:
    name = f"sb_fault_{uuid.uuid4().hex[:12]}"
    admin = _admin(admin_url)
    try:
        with admin.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        try:
            yield PrivateDatabase(name, _with_database(admin_url, name), admin_url)
        finally:
            with admin.cursor() as cursor:
                cursor.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
                cursor.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        admin.close()


# -- a cluster of the test's own -----------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PrivateCluster:
    name: str
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def ctl(self, *action: str) -> None:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", PG_VERSION, self.name, *action],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def restart(self) -> None:
        self.ctl("restart", "-m", "fast")


def private_cluster_missing_reason() -> str | None:
    if shutil.which("pg_createcluster") is None or shutil.which("pg_ctlcluster") is None:
        return "pg_createcluster/pg_ctlcluster are not installed (postgresql-common)"
    if os.geteuid() != 0:
        return "creating a private PostgreSQL cluster needs root here"
    return None


def require_private_cluster() -> None:
    reason = private_cluster_missing_reason()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true") or os.environ.get(
        "SWITCHBOARD_REQUIRE_POSTGRES"
    ) in ("1", "true"):
        pytest.fail(f"{reason}; CI requires the restart test to run")
    pytest.skip(reason)


@contextlib.contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    name = f"sbfault{uuid.uuid4().hex[:8]}"
    port = _free_port()
    subprocess.run(
        ["pg_createcluster", PG_VERSION, name, "--port", str(port)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    cluster = PrivateCluster(name, port)
    try:
        hba = Path(f"/etc/postgresql/{PG_VERSION}/{name}/pg_hba.conf")
        hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
        conf = Path(f"/etc/postgresql/{PG_VERSION}/{name}/postgresql.conf")
        with conf.open("a") as extra:  # small and fast: a test cluster
            extra.write("\nlisten_addresses = '127.0.0.1'\nfsync = off\nshared_buffers = 16MB\n")
        cluster.ctl("start")
        yield cluster
    finally:
        subprocess.run(
            ["pg_dropcluster", "--stop", PG_VERSION, name], capture_output=True, timeout=120
        )


# -- load -----------------------------------------------------------------------------------


@dataclass
class Load:
    """Threads calling `call(thread, n)` until stopped; `call` returns what it acknowledged
    (kept) or raises grpc.RpcError (its code is counted)."""

    call: Callable[[int, int], Any]
    threads: int = 4
    pause_s: float = 0.005
    acknowledged: list[Any] = field(default_factory=list)
    codes: Counter[str] = field(default_factory=Counter)
    #: (monotonic time the call ended, its code) per call, for recovery times.
    timeline: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    def _run(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                result = self.call(index, n)
            except grpc.RpcError as failed:
                with self._lock:
                    self.codes[failed.code().name] += 1
                    self.timeline.append((time.monotonic(), failed.code().name))
            else:
                with self._lock:
                    self.codes["OK"] += 1
                    self.acknowledged.append(result)
                    self.timeline.append((time.monotonic(), "OK"))
            time.sleep(self.pause_s)

    def ok_count(self) -> int:
        with self._lock:
            return self.codes["OK"]

    def first_ok_after(self, moment: float) -> float | None:
        with self._lock:
            return next((t for t, code in self.timeline if code == "OK" and t > moment), None)

    def codes_between(self, start: float, end: float) -> dict[str, int]:
        with self._lock:
            return dict(Counter(code for t, code in self.timeline if start <= t <= end))

    def wait_for_ok_after(self, moment: float, timeout_s: float = 30.0) -> float:
        """Seconds from `moment` to the first call that succeeded after it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            first = self.first_ok_after(moment)
            if first is not None:
                return first - moment
            time.sleep(0.05)
        raise AssertionError(f"no call succeeded within {timeout_s:g} s; codes {self.codes}")


def health_status(address: str, service: str = "") -> str:
    """The health status name (SERVING, NOT_SERVING), or UNREACHABLE."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        except grpc.RpcError:
            return "UNREACHABLE"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def wait_for_health(address: str, services: tuple[str, ...], want: str, timeout_s: float) -> float:
    """Seconds until every name in `services` reports `want`; fails after `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if all(health_status(address, name) == want for name in services):
            return time.monotonic() - started
        time.sleep(0.1)
    seen = {name: health_status(address, name) for name in services}
    raise AssertionError(f"health did not become {want} within {timeout_s:g} s: {seen}")


def appender(
    stub: spb_grpc.SessionServiceStub, threads: int, timeout_s: float = 5.0
) -> Callable[[int, int], int]:
    """Agent "main" with one web session per load thread, and `append(thread, n)`,
    which appends one message and returns its sequence (what `Load` drives)."""
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
    sessions = [
        stub.ResolveSession(
            spb.ResolveSessionRequest(
                agent="main", source=spb.Source(transport="web", conversation_id=f"tab-{i}")
            )
        ).session.session_id
        for i in range(threads)
    ]

    def append(index: int, n: int) -> int:
        message = spb.Message(role=spb.ROLE_USER, content=f"m-{index}-{n}")
        request = spb.AppendEventsRequest(
            agent="main",
            session_id=sessions[index],
            events=[spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))],
        )
        return stub.AppendEvents(request, timeout=timeout_s).events[0].sequence

    return append
