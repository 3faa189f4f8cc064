"""Fixtures: real Session and Delivery services (SQLite and Postgres), the platform
stand-ins on 127.0.0.1, and an `AsyncGateway` running a real adapter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway, Turn
from switchboard_client.testing import SlackStandIn, TelegramStandIn

from delivery_service.state_machine import LedgerLimits
from tests.harness import EventLoopThread, delivery_server, session_server

#: The bot whose instances the tests start (and restart): only they claim its rows.
BOT = "platform-bot"


@dataclass
class Services:
    sessions: SessionClient
    ledger: DeliveryClient
    session_address: str
    delivery_address: str


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    # A killed gateway is dead after 1 s; a failed send without retry_after waits 0.2 s.
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Services(sessions, ledger, session.address, delivery.address)


@pytest.fixture
def telegram() -> Iterator[TelegramStandIn]:
    with TelegramStandIn() as standin:
        yield standin


@pytest.fixture
def slack() -> Iterator[SlackStandIn]:
    with SlackStandIn() as standin:
        yield standin


async def echo(turn: Turn) -> str:
    return f"answer to {turn.state.state.inbox[-1].message.content}"


@asynccontextmanager
async def running_gateway(
    services: Services, adapter: Any, agent: Callable[[Turn], Any] = echo
) -> AsyncIterator[AsyncGateway]:
    """A started AsyncGateway of BOT with one adapter; claims every 0.2 s."""
    async with (
        AsyncSessionClient(services.session_address) as sessions,
        AsyncDeliveryClient(services.delivery_address) as ledger,
    ):
        gateway = AsyncGateway(
            BOT, "main", sessions, ledger, [adapter], agent, heartbeat_s=0.2, claim_every_s=0.2
        )
        await gateway.start()
        try:
            yield gateway
        finally:
            await gateway.stop()


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Waits for a condition the test cannot be told of (a bound, not a timing assert)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """`until`, blocking."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
