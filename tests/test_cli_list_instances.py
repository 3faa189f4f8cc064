"""ListInstances, the operators' view of gateway instances, through the generated stub:
pages, filters, liveness on the database's clock, rows held, bad input."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.harness import EventLoopThread, Gateway, InProcessDelivery, delivery_server
from tests.status import error_reason


@pytest.fixture
def delivery(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url) as server:
        yield server


def _ids(found: list[pb.InstanceSummary]) -> list[str]:
    """The ids, after checking the order: latest registered first, then by id descending
    (registrations in one clock tick tie on time)."""
    keys = [(s.instance.register_time.ToNanoseconds(), s.instance.instance_id) for s in found]
    assert keys == sorted(keys, reverse=True), keys
    return [s.instance.instance_id for s in found]


def _register(delivery: InProcessDelivery, name: str, *platforms: str) -> str:
    request = pb.RegisterInstanceRequest(gateway_name=name, platforms=list(platforms))
    return str(delivery.stub.RegisterInstance(request).instance.instance_id)


def _listed(delivery: InProcessDelivery, **filters: object) -> list[pb.InstanceSummary]:
    """Every page, following the tokens."""
    request = pb.ListInstancesRequest(**filters)  # type: ignore[arg-type]
    found: list[pb.InstanceSummary] = []
    while True:
        page = delivery.stub.ListInstances(request)
        found += page.instances
        if not page.next_page_token:
            return found
        request.page_token = page.next_page_token


def _expire_lease(delivery: InProcessDelivery, instance_id: str) -> None:
    """As if the instance's lease had run out (its heartbeats stopped long ago)."""
    model = delivery.unit.store.Instance
    with delivery.unit.store.backend.database.connection_context():
        model.update(
            heartbeat_at=model.heartbeat_at - 3600, lease_expires_at=model.lease_expires_at - 3600
        ).where(model.id == instance_id).execute()


def test_instances_pages_filters_liveness_and_rows_held(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)  # registers "test-gateway" with slack
    first = gateway.record("one").obligation
    gateway.record("two")
    held = gateway.instance_id
    gateway.delivered(first)
    expired = _register(delivery, "test-gateway", "slack")
    gone = _register(delivery, "other", "telegram")
    delivery.stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=gone))
    live = _register(delivery, "test-gateway", "slack", "telegram")
    _expire_lease(delivery, expired)

    everything = _listed(delivery, page_size=2)
    assert sorted(_ids(everything)) == sorted([live, gone, expired, held]), "every page"
    by_id = {s.instance.instance_id: s for s in everything}
    assert by_id[held].held_count == 1, "the delivered row is not held any more"
    assert by_id[held].instance.live and by_id[live].instance.live
    assert not by_id[expired].instance.live, "judged on the database's clock now"
    assert not by_id[gone].instance.live and by_id[gone].instance.HasField("deregister_time")
    assert list(by_id[live].instance.platforms) == ["slack", "telegram"]
    assert by_id[live].held_count == 0

    assert sorted(_ids(_listed(delivery, live_only=True))) == sorted([live, held])
    of_gw = _ids(_listed(delivery, gateway_name="test-gateway", page_size=1))
    assert sorted(of_gw) == sorted([live, expired, held])
    assert _listed(delivery, gateway_name="nobody") == []


def test_bad_input_is_invalid_argument(delivery: InProcessDelivery) -> None:
    for name in ("a", "b", "c"):
        _register(delivery, name, "slack")
    token = delivery.stub.ListInstances(pb.ListInstancesRequest(page_size=1)).next_page_token
    assert token
    refusals = [
        pb.ListInstancesRequest(page_token=token, live_only=True),  # other filters
        pb.ListInstancesRequest(page_token="not-a-token"),
        pb.ListInstancesRequest(gateway_name="x" * 129),
    ]
    for request in refusals:
        with pytest.raises(grpc.RpcError) as refused:
            delivery.stub.ListInstances(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
    assert error_reason(refused.value) != "", "a stable reason for programs"
