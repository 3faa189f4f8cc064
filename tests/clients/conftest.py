"""Fixtures: real in-process Delivery and Session services (SQLite and Postgres) and
clients for them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from switchboard_client import DeliveryClient, SessionClient

from tests.harness import (
    EventLoopThread,
    InProcessDelivery,
    InProcessSession,
    delivery_server,
    session_server,
)


@pytest.fixture
def delivery(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url) as server:
        yield server


@pytest.fixture
def client(delivery: InProcessDelivery) -> Iterator[DeliveryClient]:
    with DeliveryClient(delivery.address) as delivery_client:
        yield delivery_client


@pytest.fixture
def session(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url) as server:
        yield server


@pytest.fixture
def session_client(session: InProcessSession) -> Iterator[SessionClient]:
    with SessionClient(session.address) as client:
        yield client
