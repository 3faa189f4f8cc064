"""A real Postgres restart and a 10 s outage, against server processes as users run
them (`python -m switchboard_cli serve …`): calls answer OK or UNAVAILABLE (failing fast
while the database is gone), health says NOT_SERVING meanwhile, and both come back
within seconds of the database, with nothing acknowledged lost.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import psycopg2
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import ServerProcess, postgres_unreachable_reason
from tests.pg_faults import (
    Load,
    PrivateDatabase,
    appender,
    private_cluster,
    private_database,
    require_private_cluster,
    wait_for_health,
)

_DOWN = postgres_unreachable_reason()
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.skipif(_DOWN is not None, reason=_DOWN or ""),
    pytest.mark.timeout(180),
]

DELIVERY_NAMES = ("", "switchboard.delivery.v1.DeliveryService")
SESSION_NAMES = ("", "switchboard.session.v1.SessionService")


@contextmanager
def _server(url: str, data_dir: Path, service: str) -> Iterator[ServerProcess]:
    server = ServerProcess(url, data_dir, service=service)
    server.start()
    try:
        yield server
    finally:
        server.stop_quietly()


def _recorder(channel: grpc.Channel, threads: int) -> Any:
    stub = dpb_grpc.DeliveryServiceStub(channel)
    instances = [
        stub.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name="g", host="h", pid=1, platforms=["slack"])
        ).instance.instance_id
        for _ in range(threads)
    ]

    def record(index: int, n: int) -> str:
        request = dpb.RecordObligationRequest(
            instance_id=instances[index],
            content="answer",
            session_key=f"agent:main:slack:channel:C{index}",
            message_ref=f"m-{index}-{n}",
            platform="slack",
            chat_id=f"C{index}",
        )
        return stub.RecordObligation(request, timeout=5).obligation.id

    return record


def _stored_ids(url: str, sql: str) -> set[Any]:
    connection = psycopg2.connect(url, connect_timeout=5)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return {row[0] for row in cursor.fetchall()}
    finally:
        connection.close()


def test_a_postgres_restart_is_survived(tmp_path: Path) -> None:
    """`pg_ctlcluster … restart -m fast` of a cluster of the test's own, under load."""
    require_private_cluster()
    with private_cluster() as cluster:
        with _server(cluster.url, tmp_path, "delivery") as server:
            channel = grpc.insecure_channel(server.address)
            with Load(_recorder(channel, 3), threads=3) as obligations:
                _wait(lambda: obligations.ok_count() >= 30, "calls before the restart")
                restarted_at = time.monotonic()
                cluster.restart()
                restart_took = time.monotonic() - restarted_at
                recovery = obligations.wait_for_ok_after(restarted_at + restart_took)
                start = obligations.ok_count()
                _wait(lambda: obligations.ok_count() >= start + 30, "calls after the restart")
            wait_for_health(server.address, DELIVERY_NAMES, "SERVING", 10)
            channel.close()
        stored = _stored_ids(cluster.url, "SELECT id FROM ledger_obligation")
    print(
        f"restart -m fast took {restart_took:.2f} s; first OK {recovery:.2f} s after it "
        f"returned; codes {dict(obligations.codes)}"
    )
    assert set(obligations.codes) <= {"OK", "UNAVAILABLE"}, obligations.codes
    missing = [oid for oid in obligations.acknowledged if oid not in stored]
    assert not missing, f"acknowledged obligations lost: {missing[:10]}"


def test_a_ten_second_outage_fails_fast_and_recovers(tmp_path: Path) -> None:
    """ALLOW_CONNECTIONS false plus terminating its backends, for 10 s, then back."""
    with private_database() as db, _server(db.url, tmp_path, "session") as server:
        channel = grpc.insecure_channel(server.address)
        with Load(
            appender(spb_grpc.SessionServiceStub(channel), 3), threads=3, pause_s=0.02
        ) as appends:
            _wait(lambda: appends.ok_count() >= 30, "appends before the outage")
            db.refuse_connections()
            went_at = time.monotonic()
            not_serving = wait_for_health(server.address, SESSION_NAMES, "NOT_SERVING", 10)
            time.sleep(max(0.0, went_at + 10 - time.monotonic()))
            during = appends.codes_between(went_at + 1, went_at + 10)
            db.refuse_connections(False)
            back = time.monotonic()
            recovery = appends.wait_for_ok_after(back)
            serving = wait_for_health(server.address, SESSION_NAMES, "SERVING", 15)
            start = appends.ok_count()
            _wait(lambda: appends.ok_count() >= start + 30, "appends after the outage")
        channel.close()
        print(
            f"outage 10 s: NOT_SERVING after {not_serving:.2f} s; calls during it {during}; "
            f"first OK {recovery:.2f} s and SERVING {serving:.2f} s after it ended; "
            f"codes {dict(appends.codes)}"
        )
        assert during and set(during) == {"UNAVAILABLE"}, f"not failing fast: {during}"
        assert set(appends.codes) <= {"OK", "UNAVAILABLE"}, appends.codes
        _assert_appends_stored(db, appends)


def _assert_appends_stored(db: PrivateDatabase, appends: Load) -> None:
    logged = {row[0] for row in db.sql("SELECT seq FROM session_log")}
    missing = [seq for seq in appends.acknowledged if seq not in logged]
    assert not missing, f"acknowledged appends lost: {missing[:10]}"


def _wait(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
