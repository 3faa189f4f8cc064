from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from delivery_service.state_machine import LedgerLimits
from tests.harness import EventLoopThread, InProcessDelivery, delivery_server

StartDelivery = Callable[..., InProcessDelivery]


@pytest.fixture
def start_delivery(database_url: str, loop_thread: EventLoopThread) -> Iterator[StartDelivery]:
    """Starts DeliveryService servers on the test's database (several may share it)."""
    with ExitStack() as stack:

        def start(limits: LedgerLimits | None = None, **settings: Any) -> InProcessDelivery:
            return stack.enter_context(
                delivery_server(loop_thread, database_url, limits, **settings)
            )

        yield start


@pytest.fixture
def delivery(start_delivery: StartDelivery) -> InProcessDelivery:
    return start_delivery()
