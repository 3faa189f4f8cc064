"""Record and the fenced transitions (Hermes' TestStateMachine and TestObligationId, and more)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from delivery_service.records import compute_obligation_id
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.harness import Gateway, InProcessDelivery, get
from tests.status import error_reason


def test_record_starts_pending_owned_by_the_caller(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    response = gateway.record()
    row = response.obligation
    assert response.created
    assert row.state == pb.OBLIGATION_STATE_PENDING
    assert row.owner_instance_id == gateway.instance_id
    assert row.fence > 0
    assert row.attempts == 0
    assert row.id == compute_obligation_id("agent:main:slack:channel:C1", "m1", "the final answer")
    stored = get(delivery.stub, row.id)
    assert (stored.thread_id, stored.chat_id, stored.platform) == ("171.001", "C1", "slack")


def test_metadata_round_trips(delivery: InProcessDelivery) -> None:
    row = Gateway(delivery.stub).record(metadata={"reply_to": "m1", "parse_mode": "md"}).obligation
    assert dict(get(delivery.stub, row.id).metadata) == {"reply_to": "m1", "parse_mode": "md"}


def test_full_cycle_pending_attempting_delivered(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.record().obligation
    attempting = gateway.attempting(row)
    assert attempting.state == pb.OBLIGATION_STATE_ATTEMPTING
    assert attempting.attempts == 0, "the first send is not a recovery attempt"
    delivered = gateway.delivered(attempting, "platform-42")
    assert delivered.state == pb.OBLIGATION_STATE_DELIVERED
    assert delivered.platform_message_id == "platform-42"
    assert delivered.HasField("deliver_time")


def test_record_can_begin_the_attempt_in_the_same_call(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.record(begin_attempt=True).obligation
    assert row.state == pb.OBLIGATION_STATE_ATTEMPTING
    assert gateway.delivered(row).state == pb.OBLIGATION_STATE_DELIVERED
    again = gateway.record(begin_attempt=True)
    assert not again.created
    assert again.obligation.state == pb.OBLIGATION_STATE_DELIVERED, "never reopened"


def test_duplicate_record_does_not_reopen_a_delivered_row(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.delivered(gateway.attempting(gateway.record().obligation))
    again = Gateway(delivery.stub).record()
    assert not again.created
    assert again.obligation.id == row.id
    assert again.obligation.state == pb.OBLIGATION_STATE_DELIVERED
    assert again.obligation.owner_instance_id == gateway.instance_id, "owner is not reset"
    assert get(delivery.stub, row.id).state == pb.OBLIGATION_STATE_DELIVERED


def test_duplicate_record_of_a_pending_row_keeps_owner_and_fence(
    delivery: InProcessDelivery,
) -> None:
    first = Gateway(delivery.stub).record().obligation
    again = Gateway(delivery.stub).record().obligation
    assert (again.owner_instance_id, again.fence) == (first.owner_instance_id, first.fence)


def test_ids_are_stable_and_distinct() -> None:
    base = ("agent:main:slack:channel:C1:171.001", "m1", "the final answer")
    assert compute_obligation_id(*base) == compute_obligation_id(*base)
    assert len(compute_obligation_id(*base)) == 24
    variants = {
        compute_obligation_id(*base),
        compute_obligation_id("agent:main:slack:channel:C1:171.002", "m1", "the final answer"),
        compute_obligation_id("agent:main:slack:channel:C2:171.001", "m1", "the final answer"),
        compute_obligation_id(base[0], "m2", base[2]),
        compute_obligation_id(base[0], base[1], "another answer"),
    }
    assert len(variants) == 5


def test_rows_of_distinct_threads_do_not_collide(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    one = gateway.record(session_key="agent:main:slack:channel:C1:t1", thread_id="t1")
    two = gateway.record(session_key="agent:main:slack:channel:C1:t2", thread_id="t2")
    assert one.created and two.created
    assert one.obligation.id != two.obligation.id


def test_stale_fence_cannot_move_a_reclaimed_row(delivery: InProcessDelivery) -> None:
    crashed = Gateway(delivery.stub)
    row = crashed.attempting(crashed.record().obligation)
    crashed.die()
    rescuer = Gateway(delivery.stub)
    claimed = rescuer.claim().obligations
    assert [c.id for c in claimed] == [row.id]
    assert claimed[0].fence > row.fence

    with pytest.raises(grpc.RpcError) as refused:
        crashed.delivered(row)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "STALE_FENCE"
    assert get(delivery.stub, row.id).state == pb.OBLIGATION_STATE_ATTEMPTING

    assert rescuer.delivered(claimed[0]).state == pb.OBLIGATION_STATE_DELIVERED


def test_the_right_instance_with_an_old_fence_is_refused(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.record().obligation
    stale = pb.Obligation()
    stale.CopyFrom(row)
    stale.fence = row.fence + 7
    with pytest.raises(grpc.RpcError) as refused:
        gateway.attempting(stale)
    assert error_reason(refused.value) == "STALE_FENCE"
    assert get(delivery.stub, row.id).state == pb.OBLIGATION_STATE_PENDING


def test_repeating_a_terminal_call_is_idempotent(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.attempting(gateway.record().obligation)
    first = gateway.delivered(row, "pm-1")
    again = gateway.delivered(row, "pm-1")
    assert again == first


def test_a_different_terminal_call_after_delivery_is_refused(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.attempting(gateway.record().obligation)
    gateway.delivered(row)
    with pytest.raises(grpc.RpcError) as refused:
        gateway.failed(row)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "ILLEGAL_TRANSITION"
    assert get(delivery.stub, row.id).state == pb.OBLIGATION_STATE_DELIVERED


def test_attempting_again_after_failure_is_illegal(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.failed(gateway.attempting(gateway.record().obligation))
    with pytest.raises(grpc.RpcError) as refused:
        gateway.attempting(row)
    assert error_reason(refused.value) == "ILLEGAL_TRANSITION"


def test_retryable_failure_schedules_backoff_then_120s(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.failed(gateway.attempting(gateway.record().obligation), error="503")
    assert row.state == pb.OBLIGATION_STATE_FAILED
    assert row.last_error == "503"
    delay = row.next_attempt_time.ToNanoseconds() - row.update_time.ToNanoseconds()
    assert delay == 30 * 10**9
    second = gateway.record(content="second reply").obligation
    # A row that already spent a recovery claim waits the second step.
    second = gateway.attempting(second)
    gateway.die()
    rescuer = Gateway(delivery.stub)
    claimed = next(c for c in rescuer.claim().obligations if c.id == second.id)
    failed_again = rescuer.failed(claimed, error="503 again")
    delay = (
        failed_again.next_attempt_time.ToNanoseconds() - failed_again.update_time.ToNanoseconds()
    )
    assert delay == 120 * 10**9


def test_retry_after_overrides_the_backoff(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.attempting(gateway.record().obligation)
    failed = gateway.failed(row, error="429 flood", retry_after=Duration(seconds=7))
    delay = failed.next_attempt_time.ToNanoseconds() - failed.update_time.ToNanoseconds()
    assert delay == 7 * 10**9


def test_permanent_failure_abandons(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.attempting(gateway.record().obligation)
    abandoned = gateway.failed(row, retryable=False, error="Forbidden: bot was blocked by the user")
    assert abandoned.state == pb.OBLIGATION_STATE_ABANDONED
    assert abandoned.last_error == "Forbidden: bot was blocked by the user"
    assert gateway.failed(row, retryable=False) == abandoned, "idempotent for the holder"
