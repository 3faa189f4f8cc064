"""Fixtures: a real in-process DeliveryService (SQLite and Postgres) and a client for it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from switchboard_client import DeliveryClient

from tests.harness import EventLoopThread, InProcessDelivery, delivery_server


@pytest.fixture
def delivery(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url) as server:
        yield server


@pytest.fixture
def client(delivery: InProcessDelivery) -> Iterator[DeliveryClient]:
    with DeliveryClient(delivery.address) as delivery_client:
        yield delivery_client
