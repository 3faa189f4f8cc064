"""The Python clients carry writes over CallStream when several calls are in flight, and
call unary otherwise: the same answers and the same errors either way, and unary again
against a server without CallStream."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from switchboard_client import (
    AsyncDeliveryClient,
    AsyncSessionClient,
    DeliveryClient,
    SessionClient,
    SwitchboardError,
)

from session_service.app import SessionUnit
from session_service.composition import build_parts
from session_service.core import SessionLimits
from session_service.servicer import SessionServicer
from switchboard.database import DatabaseSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessDelivery, InProcessSession, _serve

SESSION_STREAM = "/switchboard.session.v1.SessionService/CallStream"
DELIVERY_STREAM = "/switchboard.delivery.v1.DeliveryService/CallStream"
CLIENTS = 8


def _said(text: str) -> pb.SessionEventInput:
    message = pb.Message(role=pb.ROLE_USER, content=text)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def _streams(client: Any) -> set[str]:
    """The CallStreams the client has opened (what it carried calls over)."""
    return set(client._stream_calls._streams)


def _sessions(client: SessionClient, count: int) -> list[str]:
    client.create_agent("main")
    return [
        client.resolve("main", transport="web", conversation_id=f"tab-{n}").session.session_id
        for n in range(count)
    ]


def _appends_at_once(client: SessionClient, sessions: list[str], each: int) -> None:
    """Each session's turn appends `each` events, all turns at once."""
    start = threading.Barrier(len(sessions))

    def turn(session_id: str) -> None:
        start.wait()
        for n in range(each):
            client.append("main", session_id, _said(f"{session_id} {n}"))

    with ThreadPoolExecutor(len(sessions)) as pool:
        list(pool.map(turn, sessions))


def _history(client: SessionClient, session_id: str) -> list[str]:
    return [item.message.content for item in client.history("main", session_id)]


def test_concurrent_appends_travel_over_the_stream_and_each_is_logged_once(
    session_client: SessionClient,
) -> None:
    sessions = _sessions(session_client, CLIENTS)
    _appends_at_once(session_client, sessions, 10)
    assert _streams(session_client) == {SESSION_STREAM}, "calls in flight together were carried"
    for session_id in sessions:
        assert _history(session_client, session_id) == [f"{session_id} {n}" for n in range(10)]


def test_a_lone_call_stays_unary(session_client: SessionClient) -> None:
    (session_id,) = _sessions(session_client, 1)
    for n in range(3):
        session_client.append("main", session_id, _said(f"alone {n}"))
    assert _streams(session_client) == set()


def test_a_carried_error_is_the_unary_error(session_client: SessionClient) -> None:
    """A stale expected_version sent while another call is in flight raises exactly the
    SwitchboardError the lone unary call raises."""
    (session_id,) = _sessions(session_client, 1)
    session_client.append("main", session_id, _said("first"))

    def stale() -> SwitchboardError:
        with pytest.raises(SwitchboardError) as refused:
            session_client.append("main", session_id, _said("late"), expected_version=1)
        return refused.value

    unary = stale()
    blocker = threading.Event()
    carried: list[SwitchboardError] = []

    def held_open() -> None:  # a call in flight for as long as the carried one runs
        while not blocker.is_set():
            session_client.get_session("main", session_id)

    with ThreadPoolExecutor(2) as pool:
        background = pool.submit(held_open)
        while not _streams(session_client):
            carried.append(stale())
        blocker.set()
        background.result()
    assert _streams(session_client) == {SESSION_STREAM}
    last = carried[-1]
    assert (last.code, last.reason, last.message, last.metadata) == (
        unary.code,
        unary.reason,
        unary.message,
        unary.metadata,
    )
    assert last.code == grpc.StatusCode.ABORTED


class _WithoutCallStream:
    """A server as generated code registers on it, minus CallStream's handler."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        """Registered below, from the handlers kept."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        kept = {name: handler for name, handler in handlers.items() if name != "CallStream"}
        generic = grpc.method_handlers_generic_handler(service, kept)
        self._server.add_generic_rpc_handlers((generic,))
        self._server.add_registered_method_handlers(service, kept)


class _UnitWithoutStream(SessionUnit):
    """A SessionService as a server from before CallStream: gRPC answers it UNIMPLEMENTED."""

    def add_to_server(self, server: grpc.aio.Server) -> None:
        self.servicer = SessionServicer(build_parts(self.core), self.requests)
        stripped: Any = _WithoutCallStream(server)
        pb_grpc.add_SessionServiceServicer_to_server(self.servicer, stripped)


@pytest.fixture
def old_server(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    unit = _UnitWithoutStream(DatabaseSettings(url=database_url), SessionLimits())
    with _serve(loop_thread, unit, pb_grpc.SessionServiceStub) as server:
        yield server


def test_against_a_server_without_the_stream_calls_stay_unary(
    old_server: InProcessSession,
) -> None:
    with SessionClient(old_server.address) as client:
        sessions = _sessions(client, CLIENTS)
        _appends_at_once(client, sessions, 5)
        for session_id in sessions:
            assert _history(client, session_id) == [f"{session_id} {n}" for n in range(5)]
        assert client._stream_calls._unimplemented == {SESSION_STREAM}, "it tried, once"


def test_the_delivery_cycle_at_once_travels_over_the_stream(
    delivery: InProcessDelivery, client: DeliveryClient
) -> None:
    instance = client.register("gw", ["telegram"])

    def cycle(n: int) -> Any:
        recorded = client.record(
            instance.instance_id,
            session_key=f"agent:main:telegram:dm:{n}",
            content=f"reply {n}",
            platform="telegram",
            chat_id=str(n),
            message_ref=f"m{n}",
            begin_attempt=True,
        ).obligation
        return client.mark_delivered(instance.instance_id, recorded, f"p{n}")

    with ThreadPoolExecutor(CLIENTS) as pool:
        delivered = list(pool.map(cycle, range(40)))
    assert _streams(client) == {DELIVERY_STREAM}
    assert {row.state for row in delivered} == {3}  # OBLIGATION_STATE_DELIVERED
    assert len({row.id for row in delivered}) == 40


def test_the_asyncio_clients_carry_concurrent_calls(
    session: InProcessSession, delivery: InProcessDelivery
) -> None:
    async def run() -> None:
        async with AsyncSessionClient(session.address) as sessions:
            await sessions.create_agent("main")
            ids = [
                (
                    await sessions.resolve("main", transport="web", conversation_id=f"t{n}")
                ).session.session_id
                for n in range(CLIENTS)
            ]

            async def turn(session_id: str) -> None:
                for n in range(5):
                    await sessions.append("main", session_id, _said(f"{session_id} {n}"))

            await asyncio.gather(*(turn(session_id) for session_id in ids))
            assert _streams(sessions) == {SESSION_STREAM}
            for session_id in ids:
                history = await sessions.history("main", session_id)
                contents = [item.message.content for item in history]
                assert contents == [f"{session_id} {n}" for n in range(5)]
        async with AsyncDeliveryClient(delivery.address) as ledger:
            instance = await ledger.register("gw", ["telegram"])
            rows = await asyncio.gather(
                *(
                    ledger.record(
                        instance.instance_id,
                        session_key=f"agent:main:telegram:dm:{n}",
                        content=f"reply {n}",
                        platform="telegram",
                        chat_id=str(n),
                        begin_attempt=True,
                    )
                    for n in range(20)
                )
            )
            assert _streams(ledger) == {DELIVERY_STREAM}
            assert len({row.obligation.id for row in rows}) == 20

    asyncio.run(run())


def test_streams_the_server_ends_for_their_age_are_replaced_unnoticed(
    session: InProcessSession, session_client: SessionClient
) -> None:
    """A server ends each CallStream before its connection's age limit (here after a
    tenth of a second): the calls it left unread go again on a new stream, and every
    append is logged once."""
    session.unit.servicer.carried.max_stream_age_s = 0.1
    sessions = _sessions(session_client, CLIENTS)
    _appends_at_once(session_client, sessions, 30)
    for session_id in sessions:
        assert _history(session_client, session_id) == [f"{session_id} {n}" for n in range(30)]
