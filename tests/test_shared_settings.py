"""Replicas on one database agree on the settings they judge shared rows by.

Two real `switchboard serve delivery` processes on one database: the first
stores its --max-attempts (and the other shared settings); a second with a
different value refuses to start, naming the setting and both values, unless
told to adopt the database's value (it then behaves by it) or to overwrite it.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.chaos.common import sql
from tests.harness import Gateway, ServerProcess
from tests.test_sqlite_faults import start_refused

pytestmark = pytest.mark.slow


def _stored(url: str, name: str) -> str:
    [(value,)] = sql(url, "SELECT value FROM switchboard_shared_setting WHERE name = ?", [name])
    return str(value)


def test_a_replica_whose_shared_settings_differ_refuses_to_start_unless_told(
    database_url: str, tmp_path: Path
) -> None:
    first = ServerProcess(database_url, tmp_path, "--max-attempts", "3", "--lease-ttl", "30")
    first.start()
    try:
        assert _stored(database_url, "delivery.max_attempts") == "3"

        code, output = start_refused(
            database_url, tmp_path, "--max-attempts", "1", "--lease-ttl", "5"
        )
        assert code != 0, output
        assert "listening on" not in output, output
        for named in (
            "delivery.max_attempts (--max-attempts): this replica 1, the database 3",
            "delivery.lease_ttl_s (--lease-ttl): this replica 5, the database 30",
        ):
            assert named in output, output
        assert "stale_after" not in output, "a setting that agrees was reported"

        adopting = ServerProcess(
            database_url, tmp_path, "--max-attempts", "1", "--on-settings-mismatch", "adopt"
        )
        adopting.start()
        try:
            _spends_attempts_up_to(adopting.address, expected_cap=3)
        finally:
            adopting.stop_quietly()
        assert _stored(database_url, "delivery.max_attempts") == "3", "adopt wrote its value"

        overwriting = ServerProcess(
            database_url, tmp_path, "--max-attempts", "2", "--on-settings-mismatch", "overwrite"
        )
        overwriting.start()
        overwriting.stop_quietly()
        assert _stored(database_url, "delivery.max_attempts") == "2"
    finally:
        first.stop_quietly()


def _spends_attempts_up_to(address: str, expected_cap: int) -> None:
    """Claims one row through `address` with gateway after gateway, each dying with it
    held: the row is claimed `expected_cap` times, then abandoned."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.DeliveryServiceStub(channel)
        recorder = Gateway(stub)
        row = recorder.record(message_ref="retried").obligation
        recorder.die()
        claims = 0
        for _ in range(expected_cap + 2):
            claimer = Gateway(stub)
            claimed = claimer.claim()
            if not claimed.obligations:
                assert claimed.abandoned_count == 1, claimed
                break
            assert [r.id for r in claimed.obligations] == [row.id]
            claims += 1
            claimer.die()
        assert claims == expected_cap, f"claimed {claims} times; the cap in force is not 3"
