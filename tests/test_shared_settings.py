"""Replicas on one database agree on the settings they judge shared rows by.

Two real `switchboard serve delivery` processes on one database: the first
stores its --max-attempts (and the other shared settings); a second with a
different value refuses to start, naming the setting and both values, unless
told to adopt the database's value (it then behaves by it) or to overwrite it.
The same for `switchboard serve session` and its --request-id-window and PII key
(issue 21 item 6): a retry within the stored window is answered, never run again,
whichever replica it reaches.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from switchboard.shared_settings import SESSION_SETTINGS
from tests.chaos.common import sql
from tests.harness import Gateway, ServerProcess
from tests.session.conftest import create_agent, resolve, user_message, web
from tests.test_sqlite_faults import start_refused

pytestmark = pytest.mark.slow


def _stored(url: str, name: str, table: str = "switchboard_shared_setting") -> str:
    [(value,)] = sql(url, f"SELECT value FROM {table} WHERE name = ?", [name])
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
        code, output = start_refused(database_url, tmp_path, "--request-id-window", "2")
        assert code != 0 and "listening on" not in output, output
        assert "delivery.request_id_window_s (--request-id-window): this replica 2, " in output

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


# -- the SessionService ------------------------------------------------------------------------

#: The window the first session replica stores, and the one a later replica is started with.
STORED_WINDOW_S = "86400"
FLAG_WINDOW_S = 2.0
PII_KEY = "a-pii-key-of-thirty-two-bytes..."


def _session_replica(url: str, data_dir: Path, *flags: str, key: str = "") -> ServerProcess:
    env = {"SWITCHBOARD_PII_KEY": key} if key else None
    return ServerProcess(url, data_dir, *flags, service="session", env=env)


def _session_refused(url: str, data_dir: Path, *flags: str, key: str = "") -> str:
    """What a session replica that must refuse to start said."""
    with pytest.raises(RuntimeError, match="did not start") as refused:
        _session_replica(url, data_dir, *flags, key=key).start()
    said = str(refused.value)
    assert "listening on" not in said, said
    return said


def test_session_replicas_share_the_request_id_window_and_the_pii_key(
    database_url: str, tmp_path: Path
) -> None:
    first = _session_replica(database_url, tmp_path, "--request-id-window", STORED_WINDOW_S)
    first.start()
    try:
        window = "session.request_id_window_s"
        assert float(_stored(database_url, window, SESSION_SETTINGS)) == float(STORED_WINDOW_S)
        said = _session_refused(database_url, tmp_path, "--request-id-window", "2")
        assert f"{window} (--request-id-window): this replica 2, the database 86400" in said
        said = _session_refused(
            database_url, tmp_path, "--on-settings-mismatch", "adopt", key=PII_KEY
        )
        assert "cannot adopt" in said and "session.pii_key_id" in said, said
        assert PII_KEY not in said, "the key itself is never shown"

        adopting = _session_replica(
            database_url, tmp_path, "--request-id-window", "2", "--on-settings-mismatch", "adopt"
        )
        adopting.start()
        try:
            _retries_are_answered_on_every_replica(first.address, adopting.address)
        finally:
            adopting.stop_quietly()
        assert float(_stored(database_url, window, SESSION_SETTINGS)) == float(STORED_WINDOW_S)

        keyed = _session_replica(
            database_url, tmp_path, "--on-settings-mismatch", "overwrite", key=PII_KEY
        )
        keyed.start()
        keyed.stop_quietly()
        stored_key = _stored(database_url, "session.pii_key_id", SESSION_SETTINGS)
        assert stored_key != '"none"' and PII_KEY not in stored_key
    finally:
        first.stop_quietly()


def _retries_are_answered_on_every_replica(first: str, adopting: str) -> None:
    """An append answered by `first`, retried with its request id past the adopting
    replica's own --request-id-window (but within the stored one) through both
    replicas: answered from the record each time, never appended again."""
    with grpc.insecure_channel(first) as one, grpc.insecure_channel(adopting) as other:
        stubs = [spb_grpc.SessionServiceStub(one), spb_grpc.SessionServiceStub(other)]
        create_agent(stubs[0])
        session_id = resolve(stubs[0], **web()).session.session_id
        request = spb.AppendEventsRequest(
            agent="main", session_id=session_id, events=[user_message("once")], request_id="r-1"
        )
        answered = stubs[0].AppendEvents(request)
        time.sleep(FLAG_WINDOW_S + 1.0)  # past the window the adopting replica was given
        for stub in (stubs[1], stubs[0], stubs[1]):
            assert stub.AppendEvents(request) == answered, "a retry ran again"
        history = (
            stubs[1].GetHistory(spb.GetHistoryRequest(agent="main", session_id=session_id)).messages
        )
        assert [m.message.content for m in history] == ["once"]
