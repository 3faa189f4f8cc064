"""SIGKILL a service while writes stream over CallStream (SessionService appends,
DeliveryService record-and-begin).

The stream ends UNAVAILABLE; every write it acknowledged before the kill is there after
a restart, and the ones left unanswered, retried unary with their request ids, are
written once each: nothing acknowledged is lost, nothing is written twice.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Collection, Iterator
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.chaos.common import DEADLINE, ROUNDS, Processes, channel_to, wait_for
from tests.harness import ServerProcess, postgres_unreachable_reason
from tests.pg_faults import private_database

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

_END = object()


def _append(session_id: str, token: str) -> spb.AppendEventsRequest:
    message = spb.Message(role=spb.ROLE_USER, content=token)
    event = spb.SessionEventInput(message_appended=spb.MessageAppended(message=message))
    return spb.AppendEventsRequest(
        agent="main", session_id=session_id, events=[event], request_id=str(uuid.uuid4())
    )


def _stream_until_killed(
    stub: spb_grpc.SessionServiceStub,
    requests: list[spb.AppendEventsRequest],
    kill: threading.Event,
) -> tuple[set[int], grpc.StatusCode | None]:
    """Sends the appends over one stream, many in flight, and reads answers until the
    stream breaks; returns the positions acknowledged and how the stream ended."""
    outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()

    for position, append in enumerate(requests):
        outgoing.put(spb.CallStreamRequest(correlation_id=position, append_events=append))
    acked: set[int] = set()
    try:
        for answer in stub.CallStream(_fed(outgoing)):
            assert answer.WhichOneof("result") == "append_events", answer
            acked.add(answer.correlation_id)
            if len(acked) == 5:
                kill.set()  # some are acknowledged: now kill with the rest in flight
            if len(acked) == len(requests):
                outgoing.put(_END)
    except grpc.RpcError as ended:
        return acked, ended.code()
    return acked, None


def test_sigkill_mid_stream_loses_no_acknowledged_append(
    database_url: str, processes: Processes
) -> None:
    server = processes.server(database_url, service="session")
    with channel_to(server.address) as channel:
        session_id = _agent_and_session(spb_grpc.SessionServiceStub(channel), "streamed")
    sent: list[spb.AppendEventsRequest] = []
    for round_no in range(ROUNDS):
        requests = [_append(session_id, f"r{round_no}-{n}") for n in range(400)]
        sent += requests
        kill = threading.Event()
        killer = threading.Thread(target=_kill_when, args=(kill, server))
        killer.start()
        with channel_to(server.address) as channel:
            acked, ended = _stream_until_killed(
                spb_grpc.SessionServiceStub(channel), requests, kill
            )
        killer.join(60)
        assert ended == grpc.StatusCode.UNAVAILABLE, "the kill ended the stream"
        assert 5 <= len(acked) < len(requests), "the kill came mid-stream"
        server.start()
        with channel_to(server.address) as channel:
            stub = spb_grpc.SessionServiceStub(channel)
            _wait_until_serving(stub, session_id)
            _survived_then_retried(stub, session_id, requests, acked, "the kill")
            history = _contents(stub, session_id)
    tokens = [request.events[0].message_appended.message.content for request in sent]
    assert sorted(history) == sorted(tokens), "each append logged exactly once"


def _agent_and_session(stub: spb_grpc.SessionServiceStub, conversation: str) -> str:
    """Creates the agent `main` and resolves a web conversation's session; its id."""
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")), timeout=10)
    source = spb.Source(transport="web", conversation_id=conversation)
    request = spb.ResolveSessionRequest(agent="main", source=source)
    return stub.ResolveSession(request, timeout=10).session.session_id


def _contents(stub: spb_grpc.SessionServiceStub, session_id: str) -> list[str]:
    contents: list[str] = []
    request = spb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
    while True:
        page = stub.GetHistory(request, timeout=10)
        contents += [item.message.content for item in page.messages]
        if not page.next_page_token:
            return contents
        request.page_token = page.next_page_token


def _survived_then_retried(
    stub: spb_grpc.SessionServiceStub,
    session_id: str,
    requests: list[spb.AppendEventsRequest],
    acked: Collection[int],
    fault: str,
) -> None:
    """Every acknowledged append is in the history after `fault`; then every request
    is sent again by its request id (the caller checks each was logged once)."""
    history = _contents(stub, session_id)
    acknowledged = {requests[p].events[0].message_appended.message.content for p in acked}
    assert acknowledged <= set(history), f"every acknowledged append survived {fault}"
    for request in requests:  # every one again, by its request id: once each
        stub.AppendEvents(request, timeout=10)


def _fed(outgoing: queue.SimpleQueue[object]) -> Iterator[Any]:
    """The requests put on `outgoing`, as a stream's request iterator, until `_END`."""
    while (request := outgoing.get()) is not _END:
        yield request


def _kill_when(kill: threading.Event, server: ServerProcess) -> None:
    kill.wait(60)
    server.kill()


def _wait_until_serving(stub: spb_grpc.SessionServiceStub, session_id: str) -> None:
    request = spb.GetSessionRequest(agent="main", session_id=session_id)
    wait_for(lambda: stub.GetSession(request, timeout=5), 30, "the restarted server")


def _record(instance_id: str, n: int) -> dpb.RecordObligationRequest:
    return dpb.RecordObligationRequest(
        instance_id=instance_id,
        session_key=f"agent:main:slack:dm:U{n}",
        message_ref=f"m{n}",
        content=f"reply {n}",
        platform="slack",
        chat_id=f"U{n}",
        begin_attempt=True,
        request_id=str(uuid.uuid4()),
    )


def test_connections_cut_mid_stream_lose_no_acknowledged_append(processes: Processes) -> None:
    """Postgres: every connection of the server terminated, 4 times, while 400 appends stream, with
    some answered and the rest in flight (batches committing or about to). Each carried
    call answers OK or UNAVAILABLE, the stream itself goes on; every OK is stored, and
    the rest, retried by request id, are written once each."""
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    with private_database() as db:
        server = processes.server(db.url, service="session")
        with channel_to(server.address) as channel:
            stub = spb_grpc.SessionServiceStub(channel)
            session_id = _agent_and_session(stub, "cut")
            sent: list[spb.AppendEventsRequest] = []
            cuts = 0
            for round_no in range(ROUNDS):
                requests = [_append(session_id, f"r{round_no}-{n}") for n in range(400)]
                sent += requests
                answers = _stream_cutting(stub, requests, db)
                cuts += 1
                codes = {
                    a.error.code for a in answers.values() if a.WhichOneof("result") == "error"
                }
                assert codes <= {code_pb2.UNAVAILABLE}, codes
                acked = [p for p, a in answers.items() if a.WhichOneof("result") != "error"]
                assert len(answers) == len(requests), "every carried call was answered"
                wait_for(
                    lambda: stub.GetSession(
                        spb.GetSessionRequest(agent="main", session_id=session_id), timeout=5
                    ),
                    30,
                    "the server's reconnection",
                )
                _survived_then_retried(stub, session_id, requests, acked, "the cut")
            history = _contents(stub, session_id)
    tokens = [request.events[0].message_appended.message.content for request in sent]
    assert sorted(history) == sorted(tokens), "each append logged exactly once"
    assert cuts == ROUNDS


def _stream_cutting(
    stub: spb_grpc.SessionServiceStub, requests: list[spb.AppendEventsRequest], db: Any
) -> dict[int, spb.CallStreamResponse]:
    """Sends the appends over one stream, many in flight; after 5 answers and every 100
    more, terminates every connection of the database; returns every answer by position."""
    outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()
    for position, append in enumerate(requests):
        outgoing.put(spb.CallStreamRequest(correlation_id=position, append_events=append))
    answers: dict[int, spb.CallStreamResponse] = {}
    for answer in stub.CallStream(_fed(outgoing), timeout=60):
        answers[answer.correlation_id] = answer
        if len(answers) == 5:
            assert db.terminate_backends() >= 1, "the server held no connection to cut"
        elif len(answers) % 100 == 5:
            db.terminate_backends()  # again, whether or not it has reconnected yet
        if len(answers) == len(requests):
            outgoing.put(_END)
    return answers


def test_sigkill_mid_stream_loses_no_acknowledged_ledger_write(
    database_url: str, processes: Processes
) -> None:
    """The same for the DeliveryService: replies recorded (and begun) over the stream,
    the server killed with most in flight; every acknowledged row is there, ATTEMPTING,
    after a restart, and the retries by request id answer the first answers."""
    server = processes.server(database_url, service="delivery")
    with channel_to(server.address) as channel:
        stub = dpb_grpc.DeliveryServiceStub(channel)
        registered = stub.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name="gw", platforms=["slack"]), timeout=10
        )
    instance_id = registered.instance.instance_id
    requests = [_record(instance_id, n) for n in range(400)]
    kill = threading.Event()
    killer = threading.Thread(target=_kill_when, args=(kill, server))
    killer.start()
    acked: dict[int, dpb.RecordObligationResponse] = {}
    outgoing: queue.SimpleQueue[object] = queue.SimpleQueue()

    for position, record in enumerate(requests):
        outgoing.put(dpb.CallStreamRequest(correlation_id=position, record_obligation=record))
    ended = None
    with channel_to(server.address) as channel:
        try:
            for answer in dpb_grpc.DeliveryServiceStub(channel).CallStream(_fed(outgoing)):
                assert answer.WhichOneof("result") == "record_obligation", answer
                acked[answer.correlation_id] = answer.record_obligation
                if len(acked) == 5:
                    kill.set()
                if len(acked) == len(requests):
                    outgoing.put(_END)
        except grpc.RpcError as error:
            ended = error.code()
    outgoing.put(_END)
    killer.join(60)
    assert ended == grpc.StatusCode.UNAVAILABLE and 5 <= len(acked) < len(requests)
    server.start()
    with channel_to(server.address) as channel:
        stub = dpb_grpc.DeliveryServiceStub(channel)
        for position, first in acked.items():
            row_id = first.obligation.id
            stored = stub.GetObligation(dpb.GetObligationRequest(obligation_id=row_id), timeout=10)
            assert stored.obligation.state == dpb.OBLIGATION_STATE_ATTEMPTING, position
        for position, record in enumerate(requests):  # every one again, by its request id
            retried = stub.RecordObligation(record, timeout=10)
            if position in acked:  # created=True: the first answer, not a second record
                assert retried == acked[position], "the first answer, again"
