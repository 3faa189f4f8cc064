"""First start of 3 session + 3 delivery server processes at the same moment on one
database: all come up, and exactly one process migrates each component.

Postgres: a fresh database per round (`CREATE DATABASE sb_start_…`, dropped after),
`max(3, SWITCHBOARD_CHAOS_ROUNDS)` rounds on an empty database and one on a database
left by the release before versioning (today's tables, no history, no
`resume_pending`). In every other round (and the old-database one) the test holds
the schema locks until all six replicas queue behind them, so the replicas after
the first always take the path that finds the work done. SQLite: one round of
each, each service on its own file.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import psycopg2
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from playhouse.migrate import SchemaMigrator, migrate

from delivery_service.migrations import BASELINE_MODELS as DELIVERY_BASELINE
from delivery_service.migrations import DELIVERY_SCHEMA
from session_service.migrations import BASELINE_MODELS as SESSION_BASELINE
from session_service.migrations import SESSION_SCHEMA
from session_service.storage.store import SessionStore
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.chaos.common import DEADLINE, ROUNDS, channel_to, sql, wait_for
from tests.harness import POSTGRES_URL, ServerProcess, postgres_unreachable_reason

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

REPLICAS = 3
POSTGRES_ROUNDS = max(3, ROUNDS)
HISTORY = {"session": "session_schema_history", "delivery": "ledger_schema_history"}
COMPONENTS = {"session": SESSION_SCHEMA, "delivery": DELIVERY_SCHEMA}


@contextmanager
def _fresh_postgres_database() -> Iterator[str]:
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    name = f"sb_start_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(POSTGRES_URL)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name}")
        yield urlunparse(urlparse(POSTGRES_URL)._replace(path=f"/{name}"))
    finally:
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def _make_pre_versioning(session_url: str, delivery_url: str) -> None:
    """Today's tables as the release before versioning created them, without the
    column that releases older still lacked."""
    session = open_backend(DatabaseSettings(url=session_url))
    database: Any = session.database
    with database.connection_context():
        store = SessionStore(session)
        # The store's tables as that release had them: the frozen baseline models
        # (the store's models now carry later migrations' columns).
        with database.bind_ctx(SESSION_BASELINE):
            database.create_tables(SESSION_BASELINE, safe=True)
        store.tables.Head.insert(id=1, seq=0).on_conflict_ignore().execute()
        store.tables.Retention.insert(id=1, retained_from=0).on_conflict_ignore().execute()
        drop = SchemaMigrator.from_database(database).drop_column
        migrate(drop("session_session", "resume_pending"))
    database.close()
    delivery = open_backend(DatabaseSettings(url=delivery_url))
    database = delivery.database
    # The ledger's tables as that release had them: the frozen baseline models.
    with database.connection_context(), database.bind_ctx(DELIVERY_BASELINE):
        database.create_tables(DELIVERY_BASELINE, safe=True)
    database.close()


def _answers(server: ServerProcess, n: int) -> None:
    """Healthy, and a real call goes through."""
    with channel_to(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        if server.service == "session":
            stub = spb_grpc.SessionServiceStub(channel)
            name = f"replica-{n}"
            stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name=name)), timeout=10)
            assert stub.GetAgent(spb.GetAgentRequest(name=name), timeout=10).agent.name == name
        else:
            ledger = dpb_grpc.DeliveryServiceStub(channel)
            instance = ledger.RegisterInstance(
                dpb.RegisterInstanceRequest(
                    gateway_name=f"replica-{n}", host="h", pid=n, platforms=["slack"]
                ),
                timeout=10,
            ).instance
            assert instance.live


@contextmanager
def _schema_locks_held(url: str) -> Iterator[Callable[[], None]]:
    """Holds both components' schema locks; yields `release`, which waits until every
    replica queues behind them, then lets them all go at once: each round then runs
    the path where the replicas after the first find the migration done."""
    holder = psycopg2.connect(url)
    holder.autocommit = True
    keys = (SESSION_SCHEMA.lock_key, DELIVERY_SCHEMA.lock_key)
    with holder.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s), pg_advisory_lock(%s)", keys)

    def release() -> None:
        def queued() -> bool:
            [(waiting,)] = sql(
                url,
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            return int(waiting) == 2 * REPLICAS

        wait_for(queued, 60, f"{2 * REPLICAS} replicas waiting for the schema locks")
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")

    try:
        yield release
    finally:
        holder.close()


def _start_together(
    session_url: str, delivery_url: str, data_dir: Path, old: bool, lined_up: bool = False
) -> None:
    """`lined_up`: hold the schema locks until all replicas wait for them (Postgres)."""
    servers = [
        ServerProcess(url, data_dir, service=service)
        for service, url in (("session", session_url), ("delivery", delivery_url))
        for _ in range(REPLICAS)
    ]
    try:
        with ExitStack() as gate:
            release = gate.enter_context(_schema_locks_held(session_url)) if lined_up else None
            for server in servers:
                server.launch()
            if release is not None:
                release()
        for server in servers:
            server.wait_ready(timeout_s=60)  # raises with what a failed start said
        for n, server in enumerate(servers):
            _answers(server, n)
        pids = {server.process.pid for server in servers if server.process is not None}
        for service, url in (("session", session_url), ("delivery", delivery_url)):
            rows = sql(
                url, f"SELECT version, action, applied_by FROM {HISTORY[service]} ORDER BY version"
            )
            latest = COMPONENTS[service].code_version
            expected = [
                (v, "adopted" if old and v == 1 else "applied") for v in range(1, latest + 1)
            ]
            assert [(v, a) for v, a, _ in rows] == expected, (
                f"{service}: expected each migration exactly once, the history says {rows}"
            )
            appliers = {applier for _, _, applier in rows}
            assert len(appliers) == 1, f"{service}: migrated by several replicas: {appliers}"
            [applier] = appliers
            assert int(applier.rsplit(" pid ", 1)[1]) in pids, f"{applier} is none of ours"
        [(columns,)] = sql(
            session_url,
            "SELECT COUNT(*) FROM session_session WHERE resume_pending = ?",
            (False,),
        )
        assert columns == 0  # the column exists (no sessions yet)
    finally:
        for server in servers:
            server.stop_quietly()


@pytest.mark.postgres
@pytest.mark.parametrize("round_", range(POSTGRES_ROUNDS))
def test_replicas_start_together_on_an_empty_postgres_database(tmp_path: Path, round_: int) -> None:
    with _fresh_postgres_database() as url:
        _start_together(url, url, tmp_path, old=False, lined_up=round_ % 2 == 0)


@pytest.mark.postgres
def test_replicas_start_together_on_an_old_postgres_database(tmp_path: Path) -> None:
    with _fresh_postgres_database() as url:
        _make_pre_versioning(url, url)
        _start_together(url, url, tmp_path, old=True, lined_up=True)


@pytest.mark.parametrize("old", [False, True], ids=["empty", "old"])
def test_replicas_start_together_on_sqlite(tmp_path: Path, old: bool) -> None:
    session_url = f"sqlite:///{tmp_path / 'session.sqlite3'}"
    delivery_url = f"sqlite:///{tmp_path / 'delivery.sqlite3'}"
    if old:
        _make_pre_versioning(session_url, delivery_url)
    _start_together(session_url, delivery_url, tmp_path, old=old)
