"""The platform adapter contract, on both gateways: what is required, what is
optional and its safe default, what a resumed turn carries, which send errors
are retried; and what only the asyncio gateway promises (turns concurrent on
one loop, blocking callbacks off the loop). Real services, in-process."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.adapters import SendFailed
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway
from switchboard_client.gateway import RECOVERED_MARKER, Inbound, Turn
from switchboard_client.loopback import AsyncLoopbackPlatform, LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.clients.gateway_drivers import KINDS, AnyGateway, make_gateway
from tests.harness import EventLoopThread, delivery_server, session_server

NAME = "contract-bot"
DM = pb.Source(transport="minimal", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1")


@dataclass
class Services:
    sessions: SessionClient
    ledger: DeliveryClient
    addresses: tuple[str, str]
    kind: str


@pytest.fixture(params=KINDS)
def services(
    database_url: str, loop_thread: EventLoopThread, request: pytest.FixtureRequest
) -> Iterator[Services]:
    # A failed send is due again 0.2 s later.
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Services(sessions, ledger, (session.address, delivery.address), request.param)


@dataclass
class Minimal:
    """Only what the contract requires: a name, connect and send. Nothing else."""

    name: str = "minimal"
    sent: list[tuple[str, str]] = field(default_factory=list)
    #: Exceptions the next sends raise, in order.
    failures: list[Exception] = field(default_factory=list)

    def connect(self) -> None:
        pass

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        if self.failures:
            raise self.failures.pop(0)
        self.sent.append((chat_id, text))
        return f"minimal-{len(self.sent)}"


@dataclass
class AsyncMinimal:
    """The async form of `Minimal`: `async def` connect and send, nothing else."""

    inner: Minimal

    @property
    def name(self) -> str:
        return self.inner.name

    async def connect(self) -> None:
        self.inner.connect()

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        await asyncio.sleep(0)
        return self.inner.send(chat_id, thread_id, text, idempotency_key)


def echo(turn: Turn) -> str:
    return "answer to " + " + ".join(q.message.content for q in turn.state.state.inbox)


def _gateway(services: Services, platform: Any, callback: Any = echo) -> AnyGateway:
    adapter = (
        AsyncMinimal(platform)
        if services.kind == "async" and isinstance(platform, Minimal)
        else platform
    )
    return make_gateway(
        services.kind, NAME, "main", services.addresses, [adapter], callback,
        clients=(services.sessions, services.ledger), heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip


def _owed_by_a_dead_instance(services: Services, content: str) -> dpb.Obligation:
    """A reply recorded and marked attempting by an instance that then died: it may
    have reached the platform, so its redelivery needs the marker."""
    dead = services.ledger.register(NAME, ["minimal"])
    row = services.ledger.record(
        dead.instance_id,
        session_key="agent:main:minimal:dm:chat-1",
        content=content,
        platform="minimal",
        chat_id="chat-1",
        message_ref="m-dead",
        begin_attempt=True,
    ).obligation
    services.ledger.deregister(dead.instance_id)
    return row


def _settle(gateway: AnyGateway, services: Services, row_id: str) -> dpb.Obligation:
    """Claims until the row is no longer owed (retries come due after 0.2 s)."""
    deadline = time.monotonic() + 30
    while True:
        row = services.ledger.get(row_id)
        if row.state not in (dpb.OBLIGATION_STATE_FAILED, dpb.OBLIGATION_STATE_ATTEMPTING):
            return row
        assert time.monotonic() < deadline, f"{row_id} stayed {row.state}"
        gateway.recover()
        time.sleep(0.05)


def test_an_adapter_with_only_name_connect_and_send_recovers_with_the_marker(
    services: Services,
) -> None:
    """Issue 14: such an adapter crashed Gateway.start() with AttributeError
    (idempotent_sends, was_delivered) once there was something to recover."""
    owed = _owed_by_a_dead_instance(services, "the owed reply")
    platform = Minimal()
    gateway = _gateway(services, platform)
    gateway.start()  # claims the dead instance's row at boot
    try:
        reply = gateway.handle(Inbound(DM, "hello", message_ref="m-1"))
    finally:
        gateway.stop()
    assert reply == "answer to hello"
    # Not idempotent, delivery unknown: the recovered reply carries the marker.
    assert platform.sent == [("chat-1", RECOVERED_MARKER + "the owed reply"), ("chat-1", reply)]
    assert services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED


def test_a_resumed_turn_has_no_inbound_and_its_messages_in_the_inbox(
    services: Services,
) -> None:
    """A gateway died after storing two messages of a turn, before answering them."""
    dead = services.ledger.register(NAME, ["minimal"])
    services.ledger.deregister(dead.instance_id)
    session = services.sessions.resolve(
        "main", transport="minimal", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1"
    ).session
    services.sessions.mark_resumable("main", session.session_id, holder=dead.instance_id)
    for text in ("first", "second"):
        message = pb.Message(role=pb.ROLE_USER, content=text, sender="u1")
        services.sessions.post_to_inbox("main", session.session_id, message)
    seen: list[Turn] = []

    def agent(turn: Turn) -> str:
        seen.append(turn)
        return echo(turn)

    platform = Minimal()
    gateway = _gateway(services, platform, agent)
    gateway.start()  # resumes the fresh interrupted turn
    gateway.stop()
    [turn] = seen
    assert turn.inbound is None
    assert [q.message.content for q in turn.state.state.inbox] == ["first", "second"]
    assert platform.sent == [("chat-1", "answer to first + second")]
    history = services.sessions.history("main", session.session_id)
    assert [q.message.content for q in history] == ["first", "second", "answer to first + second"]
    assert not services.sessions.get_session("main", session.session_id).resume_pending


def test_a_send_raising_anything_else_is_retried_with_the_marker(services: Services) -> None:
    """Not SendFailed: the send may or may not have gone out."""
    platform = Minimal(failures=[ConnectionResetError("connection reset by peer")])
    gateway = _gateway(services, platform)
    gateway.start()
    try:
        gateway.handle(Inbound(DM, "hello", message_ref="m-1"))  # raises inside, not out
        [row] = list(services.ledger.list())
        assert row.state == dpb.OBLIGATION_STATE_FAILED
        assert "ConnectionResetError" in row.last_error
        row = _settle(gateway, services, row.id)
    finally:
        gateway.stop()
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    assert platform.sent == [("chat-1", RECOVERED_MARKER + "answer to hello")]


def test_send_failed_retry_after_and_not_retryable(services: Services) -> None:
    """A 429's retry_after is the row's next attempt; retryable=False abandons."""
    platform = Minimal(
        failures=[
            SendFailed("429 Too Many Requests", retryable=True, retry_after_s=600),
            SendFailed("403 bot was blocked by the user", retryable=False),
        ]
    )
    gateway = _gateway(services, platform)
    gateway.start()
    try:
        gateway.handle(Inbound(DM, "first", message_ref="m-1"))
        other = pb.Source(transport="minimal", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-2")
        gateway.handle(Inbound(other, "second", message_ref="m-2"))
        assert gateway.recover() == 0, "the flood-controlled row is not due yet"
    finally:
        gateway.stop()
    limited, blocked = sorted(services.ledger.list(), key=lambda row: row.chat_id)
    assert limited.state == dpb.OBLIGATION_STATE_FAILED
    wait = limited.next_attempt_time.ToSeconds() - limited.update_time.ToSeconds()
    assert 590 <= wait <= 610, "the platform's delay, not the server's 0.2 s backoff"
    assert blocked.state == dpb.OBLIGATION_STATE_ABANDONED
    assert platform.sent == []


def test_a_was_delivered_that_raises_counts_as_unknown(services: Services) -> None:
    owed = _owed_by_a_dead_instance(services, "the owed reply")

    class CannotTell(LoopbackPlatform):
        def was_delivered(self, idempotency_key: str) -> str | None:
            raise TimeoutError("the platform's search API timed out")

    platform = CannotTell(name="minimal")
    gateway = _gateway(services, platform)
    gateway.start()
    gateway.stop()
    assert [s.text for s in platform.sent] == [RECOVERED_MARKER + "the owed reply"]
    assert services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED


# -- what only the asyncio gateway promises ------------------------------------------------


def test_async_turns_run_concurrently_on_one_loop(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """Two turns wait for each other inside the agent: only concurrent turns finish."""
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        platform = LoopbackPlatform()

        async def run() -> list[str]:
            both_thinking = asyncio.Barrier(2)

            async def agent(turn: Turn) -> str:
                await both_thinking.wait()  # a model call awaited by two turns at once
                return echo(turn)

            async with (
                AsyncSessionClient(session.address) as aio_sessions,
                AsyncDeliveryClient(delivery.address) as aio_ledger,
            ):
                gateway = AsyncGateway(
                    NAME, "main", aio_sessions, aio_ledger,
                    [AsyncLoopbackPlatform(platform)], agent, heartbeat_s=0.2,
                )  # fmt: skip
                await gateway.start()
                chats = [
                    pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id=f"c{n}")
                    for n in (1, 2)
                ]
                turns = [
                    gateway.handle(Inbound(c, f"q{c.chat_id}", message_ref="m")) for c in chats
                ]
                try:
                    return list(await asyncio.wait_for(asyncio.gather(*turns), 60))
                finally:
                    await gateway.stop()

        assert sorted(asyncio.run(run())) == ["answer to qc1", "answer to qc2"]
        assert {row.state for row in ledger.list()} == {dpb.OBLIGATION_STATE_DELIVERED}
        assert sorted(s.text for s in platform.sent) == ["answer to qc1", "answer to qc2"]


def test_async_gateway_runs_blocking_callbacks_and_adapters_off_the_loop(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url) as delivery,
        SessionClient(session.address) as sessions,
    ):
        sessions.create_agent("main")
        threads: dict[str, int] = {}
        platform = Minimal()

        class Blocking(Minimal):
            def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
                threads["send"] = threading.get_ident()
                return platform.send(chat_id, thread_id, text, idempotency_key)

        def agent(turn: Turn) -> str:  # a blocking model SDK
            threads["agent"] = threading.get_ident()
            return echo(turn)

        async def run() -> str:
            threads["loop"] = threading.get_ident()
            async with (
                AsyncSessionClient(session.address) as aio_sessions,
                AsyncDeliveryClient(delivery.address) as aio_ledger,
            ):
                gateway = AsyncGateway(NAME, "main", aio_sessions, aio_ledger, [Blocking()], agent)
                await gateway.start()
                try:
                    return await gateway.handle(Inbound(DM, "hello", message_ref="m-1"))
                finally:
                    await gateway.stop()

        assert asyncio.run(run()) == "answer to hello"
        assert platform.sent == [("chat-1", "answer to hello")]
        assert threads["agent"] != threads["loop"] and threads["send"] != threads["loop"]


def test_an_inbound_event_delivered_twice_to_one_instance_is_answered_once(
    services: Services,
) -> None:
    """Platforms redeliver events they got no quick answer for (Slack retries, a
    Telegram getUpdates offset not yet committed). Before this test the same
    instance sent the same reply again: its row was DELIVERED, but it held it.
    Since one platform message is one turn, the redelivery runs no turn at all (a
    model answers differently each time: a second turn was a second reply)."""
    platform = Minimal()
    replies = iter(["reply #1", "reply #2"])
    gateway = _gateway(services, platform, lambda turn: next(replies))
    gateway.start()
    try:
        assert gateway.handle(Inbound(DM, "hello", message_ref="ev-1")) == "reply #1"
        assert gateway.handle(Inbound(DM, "hello", message_ref="ev-1")) == "", "no second turn"
    finally:
        gateway.stop()
    assert platform.sent == [("chat-1", "reply #1")]
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    [session] = list(services.sessions.list_sessions("main"))
    assert not session.resume_pending, "the repeated turn was finished too"
    assert list(services.sessions.state("main", session.session_id).state.inbox) == []
