"""The server's interceptors run as one.

gRPC's aio server runs every registered interceptor as a coroutine of its own on
every call, each awaiting the next one's handler lookup: five interceptors cost
five coroutines and awaits per call before the method runs. Each of ours decides
synchronously once it has the method's handler (wrap it, or answer the call with a
handler of its own), so `InterceptorChain` looks the handler up once and passes it
through the stages, innermost first, in one coroutine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc

if TYPE_CHECKING:  # the stubs' generics; the class itself is not subscriptable
    Handler = grpc.RpcMethodHandler[Any, Any]


class Stage(Protocol):
    def handler_for(self, details: grpc.HandlerCallDetails, handler: Handler) -> Handler:
        """The handler this call gets, given the inner stages' `handler`."""
        ...


class InterceptorChain(grpc.aio.ServerInterceptor):
    def __init__(self, stages: Sequence[Stage]) -> None:
        """`stages` outermost first, as gRPC's own interceptor list is ordered."""
        self._innermost_first = tuple(reversed(stages))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # no such method: gRPC answers UNIMPLEMENTED
            return None
        return self.handler_for(handler_call_details, handler)

    def handler_for(self, details: grpc.HandlerCallDetails, handler: Handler) -> Handler:
        """`handler` as the stages make it for this call (`switchboard.call_stream`
        serves the calls it carries through this too)."""
        for stage in self._innermost_first:
            handler = stage.handler_for(details, handler)
        return handler
