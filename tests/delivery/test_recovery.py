"""ClaimRecoverable: Hermes' sweep cases, ported to instances and fences."""

from __future__ import annotations

import grpc
import pytest

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.delivery.conftest import StartDelivery
from tests.harness import Gateway, InProcessDelivery, age_rows, get
from tests.status import error_reason


def test_live_owner_rows_are_never_claimed(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.attempting(owner.record().obligation)
    owner.record(content="still pending")
    assert list(Gateway(delivery.stub).claim().obligations) == []


def test_dead_owner_pending_row_is_claimed_without_marker(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    row = owner.record().obligation
    owner.die()
    rescuer = Gateway(delivery.stub)
    claimed = list(rescuer.claim().obligations)
    assert [c.id for c in claimed] == [row.id]
    assert claimed[0].state == pb.OBLIGATION_STATE_ATTEMPTING
    assert claimed[0].owner_instance_id == rescuer.instance_id
    assert claimed[0].attempts == 1
    assert not claimed[0].needs_marker
    assert list(rescuer.claim().obligations) == [], "claimed rows are not claimed twice"


def test_dead_owner_attempting_row_is_claimed_with_marker(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.attempting(owner.record().obligation)
    owner.die()
    claimed = Gateway(delivery.stub).claim().obligations
    assert len(claimed) == 1 and claimed[0].needs_marker


def test_pending_row_claimed_before_gets_a_marker_next_time(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.record()
    owner.die()
    first = Gateway(delivery.stub)
    first.claim()
    first.die()
    again = Gateway(delivery.stub).claim().obligations
    assert len(again) == 1
    assert again[0].attempts == 2
    assert again[0].needs_marker, "an earlier claim may have sent it"


def test_failed_row_of_a_dead_owner_is_claimed_with_marker(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.failed(owner.attempting(owner.record().obligation))
    owner.die()
    claimed = Gateway(delivery.stub).claim().obligations
    assert len(claimed) == 1 and claimed[0].needs_marker


def test_delivered_and_abandoned_rows_are_ignored(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.delivered(owner.attempting(owner.record(content="a").obligation))
    owner.failed(owner.attempting(owner.record(content="b").obligation), retryable=False)
    owner.die()
    response = Gateway(delivery.stub).claim()
    assert list(response.obligations) == []
    assert response.abandoned_count == 0


def test_failed_row_is_claimed_by_anyone_only_after_its_backoff(
    delivery: InProcessDelivery,
) -> None:
    owner = Gateway(delivery.stub)
    row = owner.failed(owner.attempting(owner.record().obligation), error="503")
    other = Gateway(delivery.stub)
    assert list(other.claim().obligations) == [], "not due for 30 s"
    age_rows(delivery.unit, 31)
    claimed = other.claim().obligations
    assert [c.id for c in claimed] == [row.id], "due: a runtime retry, though the owner lives"
    assert claimed[0].needs_marker
    assert claimed[0].owner_instance_id == other.instance_id


def test_claimed_rows_come_ordered_by_session_then_creation(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    ids = {}
    for session, content in [("s:b", "b1"), ("s:a", "a1"), ("s:b", "b2"), ("s:a", "a2")]:
        ids[content] = owner.record(session_key=session, content=content).obligation.id
    owner.die()
    claimed = [c.id for c in Gateway(delivery.stub).claim().obligations]
    assert claimed == [ids["a1"], ids["a2"], ids["b1"], ids["b2"]]


def test_limit_bounds_a_claim(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    for i in range(5):
        owner.record(content=f"reply {i}")
    owner.die()
    rescuer = Gateway(delivery.stub)
    assert len(rescuer.claim(limit=2).obligations) == 2
    assert len(rescuer.claim(limit=10).obligations) == 3


def test_rows_at_the_attempts_cap_are_abandoned(start_delivery: StartDelivery) -> None:
    delivery = start_delivery(LedgerLimits(max_attempts=2))
    owner = Gateway(delivery.stub)
    row = owner.attempting(owner.record().obligation)
    owner.die()
    for attempt in (1, 2):
        rescuer = Gateway(delivery.stub)
        claimed = rescuer.claim().obligations
        assert [c.attempts for c in claimed] == [attempt]
        rescuer.die()
    final = Gateway(delivery.stub).claim()
    assert list(final.obligations) == []
    assert final.abandoned_count == 1
    abandoned = get(delivery.stub, row.id)
    assert abandoned.state == pb.OBLIGATION_STATE_ABANDONED
    assert "attempts cap" in abandoned.last_error


def test_due_failed_row_at_the_cap_is_abandoned_whoever_owns_it(
    start_delivery: StartDelivery,
) -> None:
    delivery = start_delivery(LedgerLimits(max_attempts=1))
    owner = Gateway(delivery.stub)
    owner.record()
    owner.die()
    rescuer = Gateway(delivery.stub)
    claimed = rescuer.claim().obligations[0]
    rescuer.failed(claimed, error="503")
    age_rows(delivery.unit, 200)
    response = rescuer.claim()
    assert list(response.obligations) == []
    assert response.abandoned_count == 1
    assert get(delivery.stub, claimed.id).state == pb.OBLIGATION_STATE_ABANDONED


def test_stale_rows_are_abandoned_even_when_their_platform_is_down(
    delivery: InProcessDelivery,
) -> None:
    owner = Gateway(delivery.stub, platforms=("telegram",))
    row = owner.record(platform="telegram").obligation
    owner.die()
    age_rows(delivery.unit, 24 * 3600 + 1)
    response = Gateway(delivery.stub, platforms=("discord",)).claim()
    assert response.abandoned_count == 1
    stale = get(delivery.stub, row.id)
    assert stale.state == pb.OBLIGATION_STATE_ABANDONED
    assert "stale" in stale.last_error


def test_absent_platform_burns_no_attempts_and_delivers_once_back(
    delivery: InProcessDelivery,
) -> None:
    owner = Gateway(delivery.stub, platforms=("telegram",))
    row = owner.attempting(owner.record(platform="telegram").obligation)
    owner.die()
    for _boot in range(5):
        boot = Gateway(delivery.stub, platforms=("discord",))
        response = boot.claim()
        assert list(response.obligations) == []
        assert response.gated_count == 1
        boot.die()
    untouched = get(delivery.stub, row.id)
    assert (untouched.state, untouched.attempts) == (pb.OBLIGATION_STATE_ATTEMPTING, 0)
    claimed = Gateway(delivery.stub, platforms=("telegram",)).claim().obligations
    assert [(c.id, c.attempts) for c in claimed] == [(row.id, 1)]


def test_default_deliverable_platforms_follow_the_latest_heartbeat(
    delivery: InProcessDelivery,
) -> None:
    owner = Gateway(delivery.stub, platforms=("slack",))
    owner.record()
    owner.die()
    rescuer = Gateway(delivery.stub, platforms=("discord",))
    assert list(rescuer.claim().obligations) == []
    rescuer.heartbeat(("discord", "slack"))
    assert len(rescuer.claim().obligations) == 1


def test_explicit_empty_platform_set_claims_nothing(delivery: InProcessDelivery) -> None:
    owner = Gateway(delivery.stub)
    owner.record()
    owner.die()
    response = Gateway(delivery.stub).claim(platforms=())
    assert list(response.obligations) == []
    assert response.gated_count == 1


def test_restarted_process_is_a_new_instance(delivery: InProcessDelivery) -> None:
    """Same name, host and pid after a restart: the old rows are still orphans."""
    before = Gateway(delivery.stub)
    row = before.record().obligation
    before.die()
    after = Gateway(delivery.stub)  # same gateway_name, host and pid
    assert after.instance_id != before.instance_id
    assert [c.id for c in after.claim().obligations] == [row.id]


def test_expired_lease_makes_an_owner_dead(start_delivery: StartDelivery) -> None:
    delivery = start_delivery(LedgerLimits(lease_ttl_s=1.0))
    owner = Gateway(delivery.stub)
    row = owner.record().obligation
    rescuer = Gateway(delivery.stub)
    assert list(rescuer.claim().obligations) == []
    # Move the owner's lease into the past rather than sleeping.
    model = delivery.unit.store.Instance
    with delivery.unit.store.backend.database.connection_context():
        model.update(lease_expires_at=model.lease_expires_at - 5).where(
            model.id == owner.instance_id
        ).execute()
    rescuer.heartbeat(("slack",))
    assert [c.id for c in rescuer.claim().obligations] == [row.id]
    with pytest.raises(grpc.RpcError) as refused:
        owner.heartbeat(("slack",))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "INSTANCE_NOT_LIVE"


def test_a_dead_instance_cannot_claim_or_record(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    gateway.die()
    for call in (gateway.claim, gateway.record):
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(refused.value) == "INSTANCE_NOT_LIVE"
