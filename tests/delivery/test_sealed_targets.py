"""Reply targets sealed by the gateways in the ledger: kept and handed back in place
of the chat id, envelope-checked, never beside a chat id. Real servers, both backends."""

from __future__ import annotations

import os
from typing import Any

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.harness import Gateway, InProcessDelivery, get
from tests.status import error_details, error_reason

RAW_KEY = "agent:main:telegram:dm:6012345678"


def sealed(size: int = 93) -> bytes:
    """Something in the envelope's shape (version 1, nonce, body, tag)."""
    return bytes([1]) + os.urandom(size - 1)


def _sealed_record(gateway: Gateway, target: bytes, **fields: Any) -> pb.RecordObligationResponse:
    return gateway.record(
        session_key=RAW_KEY, platform="telegram", chat_id="", thread_id="",
        sealed_target=target, **fields,
    )  # fmt: skip


def _rows(stub: pb_grpc.DeliveryServiceStub, **filters: Any) -> list[pb.Obligation]:
    return list(stub.ListObligations(pb.ListObligationsRequest(**filters)).obligations)


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
