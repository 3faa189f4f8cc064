"""Bad input: a clear status naming the field, and nothing written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.harness import Gateway, InProcessDelivery
from tests.status import error_details

Call = Callable[[pb_grpc.DeliveryServiceStub, Gateway, pb.Obligation], Any]


def _record(**overrides: Any) -> Call:
    def call(stub: pb_grpc.DeliveryServiceStub, gateway: Gateway, _row: pb.Obligation) -> Any:
        fields = {
            "instance_id": gateway.instance_id,
            "session_key": "agent:main:slack:dm:U1",
            "message_ref": "m9",
            "content": "hello",
            "platform": "slack",
            "chat_id": "U1",
            **overrides,
        }
        return stub.RecordObligation(pb.RecordObligationRequest(**fields))

    return call


def _mark(rpc: str, **overrides: Any) -> Call:
    def call(stub: pb_grpc.DeliveryServiceStub, gateway: Gateway, row: pb.Obligation) -> Any:
        fields = {
            "obligation_id": row.id,
            "instance_id": gateway.instance_id,
            "fence": row.fence,
            **overrides,
        }
        return getattr(stub, rpc)(getattr(pb, f"{rpc}Request")(**fields))

    return call


def _list(**fields: Any) -> Call:
    return lambda stub, _g, _r: stub.ListObligations(pb.ListObligationsRequest(**fields))


def _register(seconds: int, nanos: int = 0) -> Call:
    lease = duration_pb2.Duration(seconds=seconds, nanos=nanos)
    return lambda stub, _g, _r: stub.RegisterInstance(
        pb.RegisterInstanceRequest(gateway_name="gw", lease_ttl=lease)
    )


INVALID: dict[str, tuple[Call, str]] = {
    "empty session_key": (_record(session_key=""), "session_key"),
    "traversal session_key": (_record(session_key="../../etc/passwd"), "session_key"),
    "absolute session_key": (_record(session_key="/etc/passwd"), "session_key"),
    "control characters in session_key": (_record(session_key="agent:\x00main"), "session_key"),
    "10 MB content": (_record(content="x" * 10_000_000), "content"),
    "empty content": (_record(content=""), "content"),
    "platform with capitals": (_record(platform="Slack!"), "platform"),
    "missing chat_id": (_record(chat_id=""), "chat_id"),
    "very long message_ref": (_record(message_ref="m" * 5000), "message_ref"),
    # Key "agent:main:web:a|r1" with ref "" and key "agent:main:web:a" with ref "r1|"
    # would both hash "agent:main:web:a|r1||hi": one reply taken for the other.
    "'|' in session_key": (
        _record(session_key="agent:main:web:a|r1", message_ref=""),
        "session_key",
    ),
    "'|' in message_ref": (
        _record(session_key="agent:main:web:a", message_ref="r1|"),
        "message_ref",
    ),
    "too much metadata": (_record(metadata={f"k{i}": "v" for i in range(100)}), "metadata"),
    "traversal instance_id": (_record(instance_id="../x"), "instance_id"),
    "empty instance_id": (_record(instance_id=""), "instance_id"),
    "obligation_id not hex": (_mark("MarkDelivered", obligation_id="../../x"), "obligation_id"),
    "missing fence": (_mark("MarkAttempting", fence=0), "fence"),
    "fence beyond int64": (_mark("MarkDelivered", fence=2**64 - 1), "fence"),
    "negative retry_after": (
        _mark("MarkFailed", retryable=True, retry_after=duration_pb2.Duration(seconds=-5)),
        "retry_after",
    ),
    "unknown state filter": (_list(state=99), "state"),
    "garbage page token": (_list(page_token="not-a-token"), "page_token"),
    "unknown platform in claim": (
        lambda stub, g, _r: stub.ClaimRecoverable(
            pb.ClaimRecoverableRequest(
                instance_id=g.instance_id,
                deliverable_platforms=pb.PlatformSet(platforms=["../slack"]),
            )
        ),
        "deliverable_platforms",
    ),
    "register without a name": (
        lambda stub, _g, _r: stub.RegisterInstance(pb.RegisterInstanceRequest(gateway_name="")),
        "gateway_name",
    ),
    "register with a year-long lease": (
        lambda stub, _g, _r: stub.RegisterInstance(
            pb.RegisterInstanceRequest(
                gateway_name="gw", lease_ttl=duration_pb2.Duration(seconds=365 * 86400)
            )
        ),
        "lease_ttl",
    ),
    "negative prune age": (
        lambda stub, _g, _r: stub.PruneObligations(
            pb.PruneObligationsRequest(older_than=duration_pb2.Duration(seconds=-1))
        ),
        "older_than",
    ),
    # Durations out of normal form: each would be read as another length of time.
    "lease with nanos past a second": (_register(seconds=1, nanos=2_000_000_000), "lease_ttl"),
    "lease of seconds and nanos with opposite signs": (
        _register(seconds=60, nanos=-500_000_000),
        "lease_ttl",
    ),
    "negative lease": (_register(seconds=-30), "lease_ttl"),
    "retry_after with nanos past a second": (
        _mark(
            "MarkFailed",
            retryable=True,
            retry_after=duration_pb2.Duration(seconds=0, nanos=1_500_000_000),
        ),
        "retry_after",
    ),
    "retry_after of seconds and nanos with opposite signs": (
        _mark("MarkFailed", retryable=True, retry_after=duration_pb2.Duration(seconds=5, nanos=-5)),
        "retry_after",
    ),
    "prune age beyond a Duration's range": (
        lambda stub, _g, _r: stub.PruneObligations(
            pb.PruneObligationsRequest(older_than=duration_pb2.Duration(seconds=2**62))
        ),
        "older_than",
    ),
    # An operator call whose empty field would mean "the rows of no known gateway".
    "hand-over without a gateway to move from": (
        lambda stub, _g, _r: stub.HandOverObligations(
            pb.HandOverObligationsRequest(to_gateway_name="gw-2")
        ),
        "from_gateway_name",
    ),
    "hand-over of a named gateway with from_no_gateway": (
        lambda stub, g, _r: stub.HandOverObligations(
            pb.HandOverObligationsRequest(
                from_gateway_name="test-gateway", from_no_gateway=True, to_gateway_name="gw-2"
            )
        ),
        "from_no_gateway",
    ),
}


def _snapshot(delivery: InProcessDelivery) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    store = delivery.unit.store
    with store.backend.database.connection_context():
        database: Any = store.backend.database  # peewee's execute_sql is untyped
        obligations = database.execute_sql("SELECT * FROM ledger_obligation ORDER BY id").fetchall()
        instances = database.execute_sql("SELECT * FROM ledger_instance ORDER BY id").fetchall()
    return obligations, instances


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_argument_names_the_field_and_writes_nothing(
    delivery: InProcessDelivery, case: str
) -> None:
    call, field = INVALID[case]
    gateway = Gateway(delivery.stub)
    row = gateway.record().obligation
    before = _snapshot(delivery)
    with pytest.raises(grpc.RpcError) as refused:
        call(delivery.stub, gateway, row)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    info, fields = error_details(refused.value)
    assert fields == [field]
    assert info.domain == "switchboard" and info.reason
    assert field in (refused.value.details() or "")
    assert _snapshot(delivery) == before


def test_page_token_of_other_filters_is_refused(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    for i in range(3):
        gateway.record(content=f"reply {i}")
    first = delivery.stub.ListObligations(pb.ListObligationsRequest(page_size=1))
    assert first.next_page_token
    with pytest.raises(grpc.RpcError) as refused:
        delivery.stub.ListObligations(
            pb.ListObligationsRequest(
                page_size=1, platform="slack", page_token=first.next_page_token
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(refused.value)[0].reason == "INVALID_PAGE_TOKEN"


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (
            lambda stub: stub.GetObligation(pb.GetObligationRequest(obligation_id="0" * 24)),
            "OBLIGATION_NOT_FOUND",
        ),
        (
            lambda stub: stub.Heartbeat(pb.HeartbeatRequest(instance_id="nosuchinstance")),
            "INSTANCE_NOT_FOUND",
        ),
        (
            lambda stub: stub.RecordObligation(
                pb.RecordObligationRequest(
                    instance_id="nosuchinstance",
                    session_key="k",
                    content="c",
                    platform="slack",
                    chat_id="C",
                )
            ),
            "INSTANCE_NOT_FOUND",
        ),
        (
            lambda stub: stub.DeregisterInstance(
                pb.DeregisterInstanceRequest(instance_id="nosuchinstance")
            ),
            "INSTANCE_NOT_FOUND",
        ),
    ],
)
def test_unknown_ids_are_not_found(
    delivery: InProcessDelivery, call: Callable[[Any], Any], reason: str
) -> None:
    before = _snapshot(delivery)
    with pytest.raises(grpc.RpcError) as refused:
        call(delivery.stub)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_details(refused.value)[0].reason == reason
    assert _snapshot(delivery) == before
