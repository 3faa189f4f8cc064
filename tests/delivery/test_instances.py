"""GetInstance: whether a gateway instance is live, judged on the database's clock."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.harness import Gateway, InProcessDelivery
from tests.status import error_details


def _get(stub: pb_grpc.DeliveryServiceStub, instance_id: str) -> pb.Instance:
    return stub.GetInstance(pb.GetInstanceRequest(instance_id=instance_id)).instance


def _instance_rows(delivery: InProcessDelivery) -> list[tuple[Any, ...]]:
    database: Any = delivery.unit.store.backend.database
    with database.connection_context():
        return list(database.execute_sql("SELECT * FROM ledger_instance ORDER BY id").fetchall())


def test_a_registered_instance_reads_live(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub, ("slack", "telegram"))
    read = _get(delivery.stub, gateway.instance_id)
    assert read.instance_id == gateway.instance_id
    assert read.live
    assert list(read.platforms) == ["slack", "telegram"]
    assert read.lease_expire_time.ToNanoseconds() > read.heartbeat_time.ToNanoseconds()
    assert not read.HasField("deregister_time")


def test_a_deregistered_instance_reads_dead(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    gateway.die()
    read = _get(delivery.stub, gateway.instance_id)
    assert not read.live
    assert read.HasField("deregister_time")


def test_an_instance_whose_lease_ran_out_reads_dead(delivery: InProcessDelivery) -> None:
    """A crashed gateway never deregisters: only its lease, against the database's
    clock, says it is gone (RegisterInstance and Heartbeat can never answer that)."""
    gateway = Gateway(delivery.stub)
    model = delivery.unit.store.Instance
    with delivery.unit.store.backend.database.connection_context():
        model.update(lease_expires_at=model.lease_expires_at - 3600).where(
            model.id == gateway.instance_id
        ).execute()
    read = _get(delivery.stub, gateway.instance_id)
    assert not read.live
    assert not read.HasField("deregister_time"), "it died, it did not deregister"


def test_reading_an_instance_writes_nothing(delivery: InProcessDelivery) -> None:
    live, dead = Gateway(delivery.stub), Gateway(delivery.stub)
    dead.die()
    before = _instance_rows(delivery)
    for instance_id in (live.instance_id, dead.instance_id):
        _get(delivery.stub, instance_id)
    assert _instance_rows(delivery) == before


def test_an_unknown_instance_is_not_found(delivery: InProcessDelivery) -> None:
    with pytest.raises(grpc.RpcError) as error:
        _get(delivery.stub, "0" * 32)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_details(error.value)[0].reason == "INSTANCE_NOT_FOUND"


@pytest.mark.parametrize(
    "instance_id", ["", "../etc", "a/b", "x" * 65, "id\n"], ids=repr
)  # fmt: skip
def test_an_invalid_instance_id_is_invalid_argument(
    delivery: InProcessDelivery, instance_id: str
) -> None:
    with pytest.raises(grpc.RpcError) as error:
        _get(delivery.stub, instance_id)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(error.value)[1] == ["instance_id"]
