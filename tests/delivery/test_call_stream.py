"""DeliveryService.CallStream: the ledger transitions carried over one stream answer exactly
as their unary twins (responses, errors with their details, request ids, scope checks),
record-and-begin included, and two gateways racing through streams deliver each reply
once."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from google.protobuf.message import Message
from google.rpc import code_pb2

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.carried import Outcome, carry, status_of, twins
from tests.delivery.conftest import StartDelivery
from tests.harness import EventLoopThread, InProcessDelivery, delivery_server

GRANTS = parse_tokens("tok-main-0123=agents:main;tok-coder-012=agents:coder")
MAIN = (("authorization", "Bearer tok-main-0123"),)
CODER = (("authorization", "Bearer tok-coder-012"),)


@pytest.fixture
def secured(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url, auth=GRANTS) as server:
        yield server


def _register(stub: pb_grpc.DeliveryServiceStub, metadata: Any = MAIN) -> str:
    request = pb.RegisterInstanceRequest(
        gateway_name="gw", host="h", pid=os.getpid(), platforms=["telegram"]
    )
    return str(stub.RegisterInstance(request, metadata=metadata).instance.instance_id)


def _reply(instance_id: str, content: str, **fields: Any) -> pb.RecordObligationRequest:
    return pb.RecordObligationRequest(
        instance_id=instance_id,
        session_key="agent:main:telegram:dm:42",
        message_ref=f"m-{content}",
        content=content,
        platform="telegram",
        chat_id="42",
        **fields,
    )


def _twins(
    server: InProcessDelivery, kind: str, request: Message, metadata: Any = MAIN
) -> tuple[Outcome, Outcome]:
    return twins(server.stub, pb.CallStreamRequest, kind, request, metadata)


def test_a_full_cycle_carried_answers_as_its_unary_retries(secured: InProcessDelivery) -> None:
    """Record-and-begin, then delivered, each carried and then retried unary by its
    request id: the same answer, written once."""
    instance_id = _register(secured.stub)
    record = _reply(instance_id, "hello", begin_attempt=True, request_id=str(uuid.uuid4()))
    carried, unary = _twins(secured, "record_obligation", record)
    assert carried[0] == "ok" and carried == unary
    row = pb.RecordObligationResponse.FromString(carried[1]).obligation
    assert row.state == pb.OBLIGATION_STATE_ATTEMPTING
    delivered = pb.MarkDeliveredRequest(
        obligation_id=row.id,
        instance_id=instance_id,
        fence=row.fence,
        platform_message_id="p1",
        request_id=str(uuid.uuid4()),
    )
    carried, unary = _twins(secured, "mark_delivered", delivered)
    assert carried[0] == "ok" and carried == unary
    got = secured.stub.GetObligation(pb.GetObligationRequest(obligation_id=row.id), metadata=MAIN)
    assert got.obligation.state == pb.OBLIGATION_STATE_DELIVERED


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("an empty content", code_pb2.INVALID_ARGUMENT),
        ("another agent's key", code_pb2.PERMISSION_DENIED),
        ("no such instance", code_pb2.NOT_FOUND),
    ],
)
def test_each_record_error_is_the_unary_one(
    secured: InProcessDelivery, name: str, code: int
) -> None:
    instance_id = _register(secured.stub)
    request = _reply(instance_id, "x")
    if name == "an empty content":
        request.content = ""
    elif name == "another agent's key":
        request.session_key = "agent:coder:telegram:dm:42"
    else:
        request.instance_id = "no-such-instance"
    carried, unary = _twins(secured, "record_obligation", request)
    assert status_of(carried).code == code
    assert carried == unary, "the same code, message and details"


def test_a_stale_fence_and_a_reused_request_id_are_refused_as_unary(
    secured: InProcessDelivery,
) -> None:
    instance_id = _register(secured.stub)
    record = _reply(instance_id, "fenced", begin_attempt=True)
    row = secured.stub.RecordObligation(record, metadata=MAIN).obligation
    stale = pb.MarkFailedRequest(
        obligation_id=row.id, instance_id=instance_id, fence=row.fence + 7, error="e"
    )
    carried, unary = _twins(secured, "mark_failed", stale)
    assert carried[0] == "error" and carried == unary
    request_id = str(uuid.uuid4())
    secured.stub.Heartbeat(
        pb.HeartbeatRequest(instance_id=instance_id, request_id=request_id), metadata=MAIN
    )
    reused = pb.HeartbeatRequest(
        instance_id=instance_id, platforms=["slack"], request_id=request_id
    )
    carried, unary = _twins(secured, "heartbeat", reused)
    assert carried[0] == "error" and carried == unary


def test_two_gateways_racing_through_streams_record_each_reply_once(
    start_delivery: StartDelivery,
) -> None:
    """Two servers on one database, one stream to each, both recording (and beginning)
    the same replies at once: each reply has one row, and one MarkDelivered per row wins."""
    first, second = start_delivery(), start_delivery()
    instance_id = _register(first.stub, ())
    replies = [
        ("record_obligation", _reply(instance_id, f"r{n}", begin_attempt=True)) for n in range(12)
    ]
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(
                lambda server: carry(server.stub.CallStream, pb.CallStreamRequest, replies),
                [first, second],
            )
        )
    rows = [[a.record_obligation.obligation for a in answers] for answers in results]
    assert [row.id for row in rows[0]] == [row.id for row in rows[1]], "one row per reply"
    created = [a.record_obligation.created for answers in results for a in answers]
    assert created.count(True) == len(replies)
    marks = [
        (
            "mark_delivered",
            pb.MarkDeliveredRequest(obligation_id=row.id, instance_id=instance_id, fence=row.fence),
        )
        for row in rows[0]
    ]
    with ThreadPoolExecutor(2) as pool:
        marked = list(
            pool.map(
                lambda server: carry(server.stub.CallStream, pb.CallStreamRequest, marks),
                [first, second],
            )
        )
    for position in range(len(marks)):
        kinds = {marked[0][position].WhichOneof("result"), marked[1][position].WhichOneof("result")}
        assert "mark_delivered" in kinds, f"reply {position} was delivered"
