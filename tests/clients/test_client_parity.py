"""The asyncio clients are the blocking clients awaited: every method of theirs takes
the blocking method's arguments and says the same (both are made of one request
builder, switchboard_client._session_calls and _delivery_calls, so they send the
same request; the other tests of tests/clients run both against real servers)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from switchboard_client import (
    AsyncDeliveryClient,
    AsyncSessionClient,
    DeliveryClient,
    SessionClient,
)

#: Async methods named otherwise than their blocking twins (an async iterator).
RENAMED = {"iter_sessions": "list_sessions"}


def _public_methods(client: type[Any]) -> list[str]:
    return [
        name for name in dir(client) if not name.startswith("_") and callable(getattr(client, name))
    ]


@pytest.mark.parametrize(
    ("asynchronous", "blocking"),
    [(AsyncSessionClient, SessionClient), (AsyncDeliveryClient, DeliveryClient)],
)
def test_every_async_method_takes_the_blocking_methods_arguments(
    asynchronous: type[Any], blocking: type[Any]
) -> None:
    methods = [name for name in _public_methods(asynchronous) if name != "close"]
    assert len(methods) > 10
    for name in methods:
        twin = getattr(blocking, RENAMED.get(name, name))
        assert inspect.signature(getattr(asynchronous, name)) == inspect.signature(twin), name
        assert getattr(asynchronous, name).__doc__ == twin.__doc__, name
