"""Reply targets sealed by the gateways in the ledger, and what a DeliveryService with a
PII key keeps: the sealed target instead of a chat id, the session key as a keyed
digest that every lookup still finds, and no reply target in clear. Real servers, both
backends."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.harness import (
    EventLoopThread,
    Gateway,
    InProcessDelivery,
    ServerProcess,
    delivery_server,
    get,
)
from tests.status import error_details, error_reason

KEY = b"sealed target tests, 32 bytes .."
RAW_KEY = "agent:main:telegram:dm:6012345678"


def sealed(size: int = 93) -> bytes:
    """Something in the envelope's shape (version 1, nonce, body, tag)."""
    return bytes([1]) + os.urandom(size - 1)


def _digest(value: str) -> str:
    """The keyed digest a keyed ledger stores, computed as documented."""
    derived = hmac.new(KEY, b"switchboard ledger session key", hashlib.sha256).digest()
    return hmac.new(derived, value.encode(), hashlib.sha256).hexdigest()[:32]


def stored_key(session_key: str) -> str:
    return f"agent:main:sk_{_digest(session_key)}"


def _sealed_record(gateway: Gateway, target: bytes, **fields: Any) -> pb.RecordObligationResponse:
    return gateway.record(
        session_key=RAW_KEY, platform="telegram", chat_id="", thread_id="",
        sealed_target=target, **fields,
    )  # fmt: skip


def _rows(stub: pb_grpc.DeliveryServiceStub, **filters: Any) -> list[pb.Obligation]:
    return list(stub.ListObligations(pb.ListObligationsRequest(**filters)).obligations)


@pytest.fixture
def keyed(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url, pii_key=KEY) as server:
        yield server


def test_a_sealed_target_is_kept_and_handed_back_in_place_of_the_chat(
    delivery: InProcessDelivery,
) -> None:
    gateway = Gateway(delivery.stub, platforms=("telegram",))
    target = sealed()
    recorded = _sealed_record(gateway, target, begin_attempt=True)
    row = recorded.obligation
    assert recorded.created and row.sealed_target == target
    assert (row.chat_id, row.thread_id, row.session_key) == ("", "", RAW_KEY), "no key: as given"
    assert get(delivery.stub, row.id).sealed_target == target
    assert [listed.sealed_target for listed in _rows(delivery.stub)] == [target]

    # The same reply sealed again (a fresh nonce): the same row, the first sealing kept.
    again = _sealed_record(gateway, sealed(), begin_attempt=True)
    assert (again.created, again.obligation.id, again.obligation.sealed_target) == (
        False, row.id, target,
    )  # fmt: skip

    gateway.die()
    rescuer = Gateway(delivery.stub, platforms=("telegram",))
    [claimed] = rescuer.claim().obligations
    assert (claimed.id, claimed.sealed_target, claimed.chat_id) == (row.id, target, "")


@pytest.mark.parametrize(
    ("fields", "field", "reason"),
    [
        ({"sealed_target": sealed(1025)}, "sealed_target", "SEALED_TARGET_TOO_LARGE"),
        ({"sealed_target": b"6012345678"}, "sealed_target", "SEALED_TARGET_MALFORMED"),
        (
            {"sealed_target": bytes([2]) + os.urandom(40)},
            "sealed_target",
            "SEALED_TARGET_MALFORMED",
        ),
        ({"sealed_target": sealed(), "chat_id": "6012345678"}, "chat_id", "INVALID_FIELD"),
        ({"sealed_target": sealed(), "thread_id": "17"}, "thread_id", "INVALID_FIELD"),
        ({}, "chat_id", "INVALID_FIELD"),  # neither a chat nor a sealed target
    ],
    ids=["1025 bytes", "digits", "version 2", "beside a chat id", "beside a thread", "no target"],
)
def test_a_bad_sealed_target_is_invalid_and_writes_nothing(
    delivery: InProcessDelivery, fields: dict[str, Any], field: str, reason: str
) -> None:
    gateway = Gateway(delivery.stub, platforms=("telegram",))
    with pytest.raises(grpc.RpcError) as refused:
        gateway.record(
            **{"session_key": RAW_KEY, "platform": "telegram", "chat_id": "", "thread_id": "",
               **fields}
        )  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error_reason(refused.value), error_details(refused.value)[1]) == (reason, [field])
    assert field in (refused.value.details() or "")
    assert _rows(delivery.stub) == []


def test_a_keyed_ledger_refuses_a_reply_target_in_clear(keyed: InProcessDelivery) -> None:
    gateway = Gateway(keyed.stub, platforms=("telegram",))
    with pytest.raises(grpc.RpcError) as refused:
        gateway.record(session_key=RAW_KEY, platform="telegram", chat_id="6012345678")
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_reason(refused.value) == "SEALED_TARGET_REQUIRED"
    assert "sealed_target" in (refused.value.details() or "")
    assert _rows(keyed.stub) == []


def test_a_keyed_ledger_stores_keys_and_message_ids_hashed_and_finds_rows_by_either(
    keyed: InProcessDelivery,
) -> None:
    gateway = Gateway(keyed.stub, platforms=("telegram",))
    ref = "6012345678:4711"  # Telegram's adapter: <chat id>:<message id>
    first = _sealed_record(gateway, sealed(), message_ref=ref, content="the answer")
    row = first.obligation
    assert row.session_key == stored_key(RAW_KEY) and row.agent == "main"
    assert row.message_ref == f"ref_{_digest(ref)}"
    expected = f"{stored_key(RAW_KEY)}|ref_{_digest(ref)}|the answer"
    assert row.id == hashlib.sha256(expected.encode()).hexdigest()[:24], "over what is stored"
    again = _sealed_record(gateway, sealed(), message_ref=ref, content="the answer")
    assert (again.created, again.obligation.id) == (False, row.id), "recorded twice: one row"
    other = _sealed_record(gateway, sealed(), message_ref=ref + "1", content="the answer")
    assert other.created and other.obligation.id != row.id
    attempting = gateway.attempting(row)
    delivered = gateway.delivered(attempting, platform_message_id="6012345678:4712")
    assert delivered.platform_message_id == f"pm_{_digest('6012345678:4712')}"
    assert get(keyed.stub, row.id) == delivered

    by_raw = [listed.id for listed in _rows(keyed.stub, session_key=RAW_KEY)]
    by_stored = [listed.id for listed in _rows(keyed.stub, session_key=row.session_key)]
    assert by_raw == by_stored == [row.id, other.obligation.id]
    assert _rows(keyed.stub, session_key=RAW_KEY + "0") == []
    assert stored_key(RAW_KEY) != stored_key(RAW_KEY + "0")


def test_rows_recorded_before_the_key_are_still_found_by_their_raw_key(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with delivery_server(loop_thread, database_url) as before:
        gateway = Gateway(before.stub, platforms=("telegram",))
        old = gateway.record(session_key=RAW_KEY, platform="telegram", chat_id="6").obligation
    with delivery_server(loop_thread, database_url, pii_key=KEY) as after:
        gateway = Gateway(after.stub, platforms=("telegram",))
        new = _sealed_record(gateway, sealed(), message_ref="m2").obligation
        found = [row.id for row in _rows(after.stub, session_key=RAW_KEY)]
        assert found == [old.id, new.id]


@pytest.mark.slow
def test_serve_delivery_takes_the_pii_key_as_the_session_service_does(
    database_url: str, tmp_path: Path
) -> None:
    server = ServerProcess(database_url, tmp_path, env={"SWITCHBOARD_PII_KEY": KEY.decode()})
    server.start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            gateway = Gateway(pb_grpc.DeliveryServiceStub(channel), platforms=("telegram",))
            with pytest.raises(grpc.RpcError) as refused:
                gateway.record(session_key=RAW_KEY, platform="telegram", chat_id="6012345678")
            assert error_reason(refused.value) == "SEALED_TARGET_REQUIRED"
            row = _sealed_record(gateway, sealed()).obligation
            assert row.session_key == stored_key(RAW_KEY)
    finally:
        server.stop_quietly()
    short = ServerProcess(database_url, tmp_path, env={"SWITCHBOARD_PII_KEY": "too-short"})
    with pytest.raises(RuntimeError, match="it must be at least 16"):
        short.start()
