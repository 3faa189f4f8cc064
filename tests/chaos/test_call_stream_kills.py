"""SIGKILL the SessionService while appends stream over CallStream.

The stream ends UNAVAILABLE; every append it acknowledged before the kill is in the log
after a restart, and the ones left unanswered, retried unary with their request ids,
are logged once each: nothing acknowledged is lost, nothing is written twice.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.chaos.common import DEADLINE, ROUNDS, Processes, channel_to, wait_for
from tests.harness import ServerProcess

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

    def feed() -> Iterator[spb.CallStreamRequest]:
        while (request := outgoing.get()) is not _END:
            assert isinstance(request, spb.CallStreamRequest)
            yield request

    for position, append in enumerate(requests):
        outgoing.put(spb.CallStreamRequest(correlation_id=position, append_events=append))
    acked: set[int] = set()
    try:
        for answer in stub.CallStream(feed()):
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
        stub = spb_grpc.SessionServiceStub(channel)
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")), timeout=10)
        source = spb.Source(transport="web", conversation_id="streamed")
        session_id = stub.ResolveSession(
            spb.ResolveSessionRequest(agent="main", source=source), timeout=10
        ).session.session_id
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
            history = _contents(stub, session_id)
            acknowledged = {requests[p].events[0].message_appended.message.content for p in acked}
            assert acknowledged <= set(history), "every acknowledged append survived the kill"
            for request in requests:  # every one again, by its request id: once each
                stub.AppendEvents(request, timeout=10)
            history = _contents(stub, session_id)
    tokens = [request.events[0].message_appended.message.content for request in sent]
    assert sorted(history) == sorted(tokens), "each append logged exactly once"


def _contents(stub: spb_grpc.SessionServiceStub, session_id: str) -> list[str]:
    contents: list[str] = []
    request = spb.GetHistoryRequest(agent="main", session_id=session_id, limit=1000)
    while True:
        page = stub.GetHistory(request, timeout=10)
        contents += [item.message.content for item in page.messages]
        if not page.next_page_token:
            return contents
        request.page_token = page.next_page_token


def _kill_when(kill: threading.Event, server: ServerProcess) -> None:
    kill.wait(60)
    server.kill()


def _wait_until_serving(stub: spb_grpc.SessionServiceStub, session_id: str) -> None:
    request = spb.GetSessionRequest(agent="main", session_id=session_id)
    wait_for(lambda: stub.GetSession(request, timeout=5), 30, "the restarted server")
