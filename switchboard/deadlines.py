"""The calling RPC's deadline, carried from gRPC to the transaction runner.

`DeadlineInterceptor` sets `CALL_DEADLINE` (a `time.monotonic()` instant) from
`context.time_remaining()` for the duration of each call; the runner reads it when
an operation is queued, and drops the operation if the deadline has passed before
its turn: the caller has gone, and executing it would only lengthen the queue.
The interceptor also reports calls that failed UNAVAILABLE, so health checking
probes the database at once instead of at its next tick.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from switchboard.errors import Unavailable
from switchboard.grpc_errors import WrappingInterceptor

#: When the current call's deadline passes, on the monotonic clock; None without one.
CALL_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "switchboard_call_deadline", default=None
)


def _deadline_of(context: grpc.aio.ServicerContext[Any, Any]) -> float | None:
    remaining = context.time_remaining()
    if remaining is None or remaining > 10 * 365 * 86400:  # no deadline set
        return None
    return time.monotonic() + float(remaining)


class DeadlineInterceptor(WrappingInterceptor):
    """Sets `CALL_DEADLINE` per call; calls `on_unavailable` when a call fails UNAVAILABLE."""

    def __init__(self, on_unavailable: Callable[[], None] = lambda: None) -> None:
        super().__init__()
        self._on_unavailable = on_unavailable

    def wrap_unary(
        self,
        method: str,
        behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]],
    ) -> Any:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            token = CALL_DEADLINE.set(_deadline_of(context))
            try:
                return await behavior(request, context)
            except Unavailable:
                self._on_unavailable()
                raise
            finally:
                CALL_DEADLINE.reset(token)

        return wrapped

    def wrap_stream(
        self,
        method: str,
        behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]],
    ) -> Any:
        async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            token = CALL_DEADLINE.set(_deadline_of(context))
            try:
                async for response in behavior(request, context):
                    yield response
            except Unavailable:
                self._on_unavailable()
                raise
            finally:
                # A generator closed from another task has another context.
                with contextlib.suppress(ValueError):
                    CALL_DEADLINE.reset(token)

        return wrapped
