"""--max-concurrent-rpcs for calls with one answer only.

gRPC's own `maximum_concurrent_rpcs` counts every call, streams included, so idle
watchers (long-lived WatchEvents streams, which have their own cap, --max-watchers)
could lock out every other call and the health probe. This interceptor counts
unary-answer calls only and leaves health checking and reflection out: beyond the
limit a call is answered RESOURCE_EXHAUSTED before its request is read.

An admitted call is served through a request-streaming handler that reads its one
request itself (`grpc_errors.read_request`), so the slot is given back in a `finally`
whatever happens to the call (gRPC never starts a unary handler whose request did not
arrive or parse). It is a stage inside `DomainErrorInterceptor`, which answers a
request that cannot be read.
"""

from __future__ import annotations

from typing import Any

import grpc

from switchboard.auth import EXEMPT_PREFIXES
from switchboard.errors import ResourceExhausted
from switchboard.grpc_errors import read_request, request_type, rich_status


class UnaryLimitInterceptor:
    """A stage of the server's `InterceptorChain`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def handler_for(
        self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler this call gets (see `interceptor_chain`)."""
        if handler.unary_unary is None or details.method.startswith(EXEMPT_PREFIXES):
            return handler
        if self.in_flight >= self.limit:
            return _refusing(handler)
        self.in_flight += 1
        return self._counted(details.method, handler)

    def _counted(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        behavior: Any = handler.unary_unary
        type_name = request_type(handler)

        async def counted(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            try:
                return await behavior(await read_request(context, method, type_name), context)
            finally:
                self.in_flight -= 1

        return grpc.stream_unary_rpc_method_handler(
            counted,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _refusing(handler: grpc.RpcMethodHandler[Any, Any]) -> grpc.RpcMethodHandler[Any, Any]:
    status = rich_status(
        ResourceExhausted(
            "TOO_MANY_CALLS",
            "this server is serving --max-concurrent-rpcs calls already; retry with backoff",
        )
    )

    async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(status.code, status.details, status.trailing_metadata)

    return grpc.stream_unary_rpc_method_handler(
        refuse, response_serializer=handler.response_serializer
    )
