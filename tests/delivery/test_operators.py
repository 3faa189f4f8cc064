"""Operator RPCs: list, stats, retry, abandon, prune (retention never loses owed rows)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.harness import Gateway, InProcessDelivery, age_rows, get
from tests.status import error_reason

DAY = 86400


def _list_all(delivery: InProcessDelivery, **filters: object) -> list[pb.Obligation]:
    rows: list[pb.Obligation] = []
    token = ""
    while True:
        page = delivery.stub.ListObligations(
            pb.ListObligationsRequest(page_size=2, page_token=token, **filters)  # type: ignore[arg-type]
        )
        rows.extend(page.obligations)
        token = page.next_page_token
        if not token:
            return rows


def test_list_pages_through_rows_in_creation_order(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    ids = [gateway.record(content=f"reply {i}").obligation.id for i in range(5)]
    assert [row.id for row in _list_all(delivery)] == ids


def test_list_filters_by_state_platform_session_and_owner(delivery: InProcessDelivery) -> None:
    first, second = Gateway(delivery.stub), Gateway(delivery.stub, platforms=("telegram",))
    slack = first.record(content="a").obligation
    done = first.delivered(first.record(content="b").obligation)
    tele = second.record(content="c", platform="telegram", session_key="agent:x:tg").obligation
    assert [r.id for r in _list_all(delivery, state=pb.OBLIGATION_STATE_DELIVERED)] == [done.id]
    assert [r.id for r in _list_all(delivery, platform="telegram")] == [tele.id]
    assert [r.id for r in _list_all(delivery, session_key="agent:x:tg")] == [tele.id]
    owned = _list_all(delivery, owner_instance_id=first.instance_id)
    assert [r.id for r in owned] == [slack.id, done.id]


def test_stats_count_states_doubt_and_gated_platforms(delivery: InProcessDelivery) -> None:
    crashed = Gateway(delivery.stub, platforms=("slack", "telegram"))
    crashed.attempting(crashed.record(content="in flight").obligation)
    crashed.record(content="for telegram", platform="telegram")
    crashed.delivered(crashed.record(content="done").obligation)
    crashed.die()
    Gateway(delivery.stub, platforms=("slack",))
    stats = delivery.stub.GetLedgerStats(pb.GetLedgerStatsRequest())
    counts = {c.state: c.count for c in stats.state_counts}
    assert counts[pb.OBLIGATION_STATE_ATTEMPTING] == 1
    assert counts[pb.OBLIGATION_STATE_PENDING] == 1
    assert counts[pb.OBLIGATION_STATE_DELIVERED] == 1
    assert counts[pb.OBLIGATION_STATE_FAILED] == 0
    assert stats.in_doubt_count == 1
    assert [(g.platform, g.count) for g in stats.gated] == [("telegram", 1)]
    assert stats.live_instance_count == 1
    assert stats.oldest_pending_age.ToNanoseconds() >= 0
    age_rows(delivery.unit, 600)
    aged = delivery.stub.GetLedgerStats(pb.GetLedgerStatsRequest())
    assert aged.oldest_pending_age.seconds >= 600


def test_retry_makes_an_abandoned_row_due_with_a_fresh_budget(
    delivery: InProcessDelivery,
) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.failed(gateway.attempting(gateway.record().obligation), retryable=False)
    retried = delivery.stub.RetryObligation(pb.RetryObligationRequest(obligation_id=row.id))
    assert retried.obligation.state == pb.OBLIGATION_STATE_FAILED
    assert retried.obligation.attempts == 0
    assert retried.obligation.owner_instance_id == ""
    assert retried.obligation.fence > row.fence
    claimed = gateway.claim().obligations
    assert [c.id for c in claimed] == [row.id]
    assert claimed[0].needs_marker


@pytest.mark.parametrize("state", ["delivered", "pending"])
def test_retry_refuses_delivered_and_owed_rows(delivery: InProcessDelivery, state: str) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.record().obligation
    if state == "delivered":
        row = gateway.delivered(row)
    with pytest.raises(grpc.RpcError) as refused:
        delivery.stub.RetryObligation(pb.RetryObligationRequest(obligation_id=row.id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == (
        "ALREADY_DELIVERED" if state == "delivered" else "STILL_OWED"
    )
    assert get(delivery.stub, row.id) == row


def test_retry_refuses_a_stale_row(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.failed(gateway.record().obligation, retryable=False)
    age_rows(delivery.unit, 2 * DAY)
    with pytest.raises(grpc.RpcError) as refused:
        delivery.stub.RetryObligation(pb.RetryObligationRequest(obligation_id=row.id))
    assert error_reason(refused.value) == "OBLIGATION_STALE"


def test_abandon_fences_out_the_holder(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    row = gateway.attempting(gateway.record().obligation)
    abandoned = delivery.stub.AbandonObligation(
        pb.AbandonObligationRequest(obligation_id=row.id, reason="chat archived")
    ).obligation
    assert abandoned.state == pb.OBLIGATION_STATE_ABANDONED
    assert abandoned.last_error == "abandoned by operator: chat archived"
    with pytest.raises(grpc.RpcError) as refused:
        gateway.delivered(row)
    assert error_reason(refused.value) == "STALE_FENCE"
    with pytest.raises(grpc.RpcError) as delivered:
        done = gateway.delivered(gateway.record(content="other").obligation)
        delivery.stub.AbandonObligation(pb.AbandonObligationRequest(obligation_id=done.id))
    assert error_reason(delivered.value) == "ALREADY_DELIVERED"


def test_prune_deletes_only_old_terminal_rows(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    delivered = gateway.delivered(gateway.record(content="delivered").obligation)
    abandoned = gateway.failed(gateway.record(content="abandoned").obligation, retryable=False)
    owed = [
        gateway.record(content="pending").obligation,
        gateway.attempting(gateway.record(content="attempting").obligation),
        gateway.failed(gateway.record(content="failed").obligation),
    ]
    assert delivery.stub.PruneObligations(pb.PruneObligationsRequest()).pruned_count == 0
    age_rows(delivery.unit, 8 * DAY)
    assert delivery.stub.PruneObligations(pb.PruneObligationsRequest()).pruned_count == 2
    remaining = {row.id for row in _list_all(delivery)}
    assert remaining == {row.id for row in owed}
    assert delivered.id not in remaining and abandoned.id not in remaining


def test_prune_with_an_explicit_age(delivery: InProcessDelivery) -> None:
    gateway = Gateway(delivery.stub)
    gateway.delivered(gateway.record().obligation)
    age_rows(delivery.unit, 120)
    keep = pb.PruneObligationsRequest(older_than=duration_pb2.Duration(seconds=3600))
    assert delivery.stub.PruneObligations(keep).pruned_count == 0
    drop = pb.PruneObligationsRequest(older_than=duration_pb2.Duration(seconds=60))
    assert delivery.stub.PruneObligations(drop).pruned_count == 1
