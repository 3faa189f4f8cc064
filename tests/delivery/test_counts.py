"""Operators' filters and counts: rows of one agent, rows still owed, and how many rows
an action on "all matching" would touch, overall and per session key. Real servers,
both backends."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from tests.harness import EventLoopThread, Gateway, InProcessDelivery, delivery_server
from tests.status import error_reason

ADMIN = (("authorization", "Bearer tok-admin"),)
ALICE = (("authorization", "Bearer tok-alice"),)
GRANTS = parse_tokens("tok-admin=admin;tok-alice=agents:alice")


@pytest.fixture
def secured(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url, auth=GRANTS) as server:
        yield server


def _rows(gateway: Gateway) -> dict[str, pb.Obligation]:
    """alice: two owed rows on one key and one delivered; bob: one failed row."""
    key_a = "agent:alice:slack:channel:C1"
    rows = {
        "a1": gateway.record("one", session_key=key_a, message_ref="m1").obligation,
        "a2": gateway.record("two", session_key=key_a, message_ref="m2").obligation,
        "a3": gateway.record("three", session_key="agent:alice:web:t", message_ref="m3").obligation,
        "b1": gateway.record(
            "four", session_key="agent:bob:slack:dm:U1", message_ref="m4"
        ).obligation,
    }
    gateway.delivered(rows["a3"])
    gateway.failed(rows["b1"])
    return rows


def test_rows_of_an_agent_and_rows_still_owed(delivery: InProcessDelivery) -> None:
    stub = delivery.stub
    rows = _rows(Gateway(stub))

    def listed(**filters: object) -> set[str]:
        answer = stub.ListObligations(pb.ListObligationsRequest(**filters))  # type: ignore[arg-type]
        return {row.id for row in answer.obligations}

    assert listed(agent="alice") == {rows["a1"].id, rows["a2"].id, rows["a3"].id}
    assert listed(owed_only=True) == {rows["a1"].id, rows["a2"].id, rows["b1"].id}
    assert listed(agent="bob", owed_only=True) == {rows["b1"].id}
    first = stub.ListObligations(pb.ListObligationsRequest(owed_only=True, page_size=2))
    rest = stub.ListObligations(
        pb.ListObligationsRequest(owed_only=True, page_size=2, page_token=first.next_page_token)
    )
    assert len(first.obligations) + len(rest.obligations) == 3


def test_counts_match_the_list_overall_and_per_session_key(delivery: InProcessDelivery) -> None:
    stub = delivery.stub
    rows = _rows(Gateway(stub))
    key_a = rows["a1"].session_key
    answer = stub.CountObligations(
        pb.CountObligationsRequest(owed_only=True, session_keys=[key_a, "agent:nobody:x", key_a])
    )
    assert answer.count == 3
    assert [(c.session_key, c.count) for c in answer.session_key_counts] == [
        (key_a, 2),
        ("agent:nobody:x", 0),
        (key_a, 2),
    ]
    failed = stub.CountObligations(pb.CountObligationsRequest(state=pb.OBLIGATION_STATE_FAILED))
    assert failed.count == 1
    assert stub.CountObligations(pb.CountObligationsRequest(platform="slack")).count == 4


def test_bad_count_filters_are_refused(delivery: InProcessDelivery) -> None:
    stub = delivery.stub
    for request, field in (
        (
            pb.CountObligationsRequest(state=pb.OBLIGATION_STATE_PENDING, owed_only=True),
            "owed_only",
        ),
        (pb.CountObligationsRequest(session_keys=["k"] * 1001), "session_keys"),
        (pb.CountObligationsRequest(platform="Not A Platform"), "platform"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            stub.CountObligations(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert field in (refused.value.details() or "")
    with pytest.raises(grpc.RpcError) as both:
        stub.ListObligations(
            pb.ListObligationsRequest(state=pb.OBLIGATION_STATE_FAILED, owed_only=True)
        )
    assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_an_agent_token_counts_and_filters_its_own_rows_only(
    secured: InProcessDelivery,
) -> None:
    stub = secured.stub
    instance_id = stub.RegisterInstance(
        pb.RegisterInstanceRequest(gateway_name="gw", platforms=["slack"]), metadata=ADMIN
    ).instance.instance_id
    for key, ref in (("agent:alice:web:t", "a"), ("agent:bob:web:t", "b")):
        stub.RecordObligation(
            pb.RecordObligationRequest(
                instance_id=instance_id,
                session_key=key,
                message_ref=ref,
                content="x",
                platform="web",
                chat_id="t",
            ),
            metadata=ADMIN,
        )
    assert stub.CountObligations(pb.CountObligationsRequest(), metadata=ALICE).count == 1
    assert stub.CountObligations(pb.CountObligationsRequest(), metadata=ADMIN).count == 2
    with pytest.raises(grpc.RpcError) as refused:
        stub.CountObligations(pb.CountObligationsRequest(agent="bob"), metadata=ALICE)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(refused.value) == "AGENT_SCOPE"
