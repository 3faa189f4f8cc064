"""The one place where domain errors become gRPC statuses.

`DomainErrorInterceptor` wraps every handler of an aio server: a `DomainError`
becomes its status code with a `google.rpc.ErrorInfo` (stable reason) and, for
invalid arguments, a `google.rpc.BadRequest` naming the field. Anything else is
logged and answered INTERNAL, never UNKNOWN.

A request gRPC cannot decode is the caller's error too: INVALID_ARGUMENT
(MALFORMED_REQUEST), logged in one warning line at most per `LOG_PERIOD_S`. gRPC
decodes a unary request before any handler runs, answers a failure UNKNOWN with a
traceback, and never answers a call that ended before a whole request arrived; so a
method with one request is served through a request-streaming handler that reads
its request itself (`read_request`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from switchboard import errors
from switchboard.log_budget import LOG_PERIOD_S, LogBudget

ERROR_DOMAIN = "switchboard"
# gRPC refuses trailers over 16 KiB, and a status travels twice in them (grpc-message,
# percent-encoded up to 3x, and grpc-status-details-bin); messages that quote request
# text are cut well below that, or the caller gets RESOURCE_EXHAUSTED instead.
MAX_MESSAGE_BYTES = 1024
MAX_METADATA_BYTES = 256

log = logging.getLogger(__name__)
#: Undecodable requests are logged in one line per period at most: a flood of them
#: (a fuzzer, a broken client) cannot flood the log.
_MALFORMED_LINES = LogBudget(lines=1, period_s=LOG_PERIOD_S)

_STATUS_OF: dict[type[errors.DomainError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.MalformedRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    errors.OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    errors.Aborted: grpc.StatusCode.ABORTED,
    errors.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
    errors.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def status_code_of(error: errors.DomainError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in _STATUS_OF:
            return _STATUS_OF[cls]
    return grpc.StatusCode.INTERNAL


def _packed(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def bounded(text: str, max_bytes: int) -> str:
    """`text` cut to at most about `max_bytes` of UTF-8, saying how much was left out."""
    encoded = text.encode()
    if len(encoded) <= max_bytes:
        return text
    kept = encoded[:max_bytes].decode(errors="ignore")
    return f"{kept}... ({len(text) - len(kept)} more characters)"


def rich_status(error: errors.DomainError) -> grpc.Status:
    code = status_code_of(error)
    message = bounded(error.message, MAX_MESSAGE_BYTES)
    metadata = {
        bounded(key, MAX_METADATA_BYTES): bounded(value, MAX_METADATA_BYTES)
        for key, value in error.metadata.items()
    }
    details = [
        _packed(
            error_details_pb2.ErrorInfo(reason=error.reason, domain=ERROR_DOMAIN, metadata=metadata)
        )
    ]
    if isinstance(error, errors.InvalidArgument):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=bounded(error.field, MAX_METADATA_BYTES), description=message
        )
        details.append(_packed(error_details_pb2.BadRequest(field_violations=[violation])))
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=details)
    converted: grpc.Status = rpc_status.to_status(status)
    return converted


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: Exception) -> None:
    if isinstance(exc, errors.DomainError):
        status = rich_status(exc)
        await context.abort(status.code, status.details, status.trailing_metadata)
    log.exception("unhandled error in handler", exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error; the server log has details")


def _wrap_unary(
    behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapped


def _wrap_stream(
    behavior: Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for response in behavior(request, context):
                yield response
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)

    return wrapped


class WrappingInterceptor:
    """Base of the server interceptors: wraps each method's behaviour once.

    Every call asks the inner interceptors for its handler (an inner one may answer
    a call with a handler of its own, as authentication does for a refused one);
    the wrapping is cached per method and redone only when the inner handler
    differs from the last one. Unknown methods are not cached, so junk method names
    cannot grow the cache.
    """

    def __init__(self) -> None:
        self._wrapped: dict[
            str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]
        ] = {}

    def handler_for(
        self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """The handler this call gets (see `interceptor_chain`): the inner one, wrapped."""
        wrapped = self.wrapped(details.method, handler)
        assert wrapped is not None
        return wrapped

    def wrapped(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any] | None
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """`handler` with this interceptor's wrapping (cached per method)."""
        if handler is None:
            return None
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self.rewrap(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def rewrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """`handler` with its behaviour wrapped by `wrap_unary` or `wrap_stream`."""
        wrapped = rewrapped(
            handler,
            lambda behavior: self.wrap_unary(method, behavior),
            lambda behavior: self.wrap_stream(method, behavior),
        )
        assert wrapped is not None
        return wrapped

    def wrap_unary(self, method: str, behavior: Any) -> Any:
        return behavior

    def wrap_stream(self, method: str, behavior: Any) -> Any:
        return behavior


class DomainErrorInterceptor(WrappingInterceptor):
    """Maps domain errors raised by any handler to rich gRPC statuses; methods with one
    request read it themselves (`reading_its_request`), so that one gRPC cannot decode
    is mapped too."""

    def rewrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        return super().rewrap(method, reading_its_request(method, handler))

    def wrap_unary(self, method: str, behavior: Any) -> Any:
        return _wrap_unary(behavior)

    def wrap_stream(self, method: str, behavior: Any) -> Any:
        return _wrap_stream(behavior)


def request_type(handler: grpc.RpcMethodHandler[Any, Any]) -> str:
    """The full name of the handler's request message ("request" when unknown)."""
    message_class = getattr(handler.request_deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "request"))


async def read_request(
    context: grpc.aio.ServicerContext[Any, Any], method: str, type_name: str
) -> Any:
    """The call's one request, read by a request-streaming handler; `MalformedRequest`
    when it cannot be decoded or the call ended before a whole one arrived."""
    try:
        request = await context.read()
    except DecodeError as undecodable:
        what = f"the body is not a valid {type_name}"
        raise _malformed(method, type_name, what, undecodable) from undecodable
    if request is None or request is grpc.aio.EOF:
        raise _malformed(
            method, type_name, f"the call ended before a whole {type_name} arrived", None
        )
    return request


def _malformed(
    method: str, type_name: str, what: str, cause: Exception | None
) -> errors.MalformedRequest:
    # protobuf says "Error parsing message with type 'T': what was wrong": T is said already.
    wrong = str(cause).rpartition("': ")[2] if cause is not None else ""
    said = f" ({bounded(wrong, MAX_METADATA_BYTES)})" if wrong else ""
    held = _MALFORMED_LINES.take()
    if held is not None:
        note = f" ({held} more since, not logged)" if held else ""
        log.warning("%s: %s%s; answered INVALID_ARGUMENT%s", method, what, said, note)
    return errors.MalformedRequest(
        "MALFORMED_REQUEST",
        f"{what}{said}: send one serialized {type_name}, whole, as the call's body",
        {"message_type": type_name},
    )


def reading_its_request(
    method: str, handler: grpc.RpcMethodHandler[Any, Any]
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of one request (unary-unary, unary-stream) as the request-streaming
    handler that reads it with `read_request` and then runs the behaviour on it; a
    request-streaming handler is returned as it is."""
    if handler.request_streaming:
        return handler
    type_name = request_type(handler)
    serializers: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        answer = handler.unary_unary

        async def read_then_answer(_requests: Any, context: Any) -> Any:
            return await answer(await read_request(context, method, type_name), context)

        return grpc.stream_unary_rpc_method_handler(read_then_answer, **serializers)
    stream = _as_async_generator(handler.unary_stream)

    async def read_then_stream(_requests: Any, context: Any) -> AsyncIterator[Any]:
        async for response in stream(await read_request(context, method, type_name), context):
            yield response

    return grpc.stream_stream_rpc_method_handler(read_then_stream, **serializers)


def rewrapped(
    handler: grpc.RpcMethodHandler[Any, Any] | None,
    unary: Callable[[Any], Any],
    stream: Callable[[Any], Any],
) -> grpc.RpcMethodHandler[Any, Any] | None:
    """The handler with its behaviour wrapped: `unary` wraps behaviours with one
    response, `stream` those with a stream of responses. A request-streaming
    behaviour gets its request iterator where a unary one gets its request (the
    services have none; authentication answers refused calls with one, so that
    gRPC never reads their request): wrappers pass it on untouched."""
    if handler is None:
        return None
    serializers: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **serializers)
    if handler.unary_stream is not None:
        behavior = _as_async_generator(handler.unary_stream)
        return grpc.unary_stream_rpc_method_handler(stream(behavior), **serializers)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **serializers)
    if handler.stream_stream is not None:
        behavior = _as_async_generator(handler.stream_stream)
        return grpc.stream_stream_rpc_method_handler(stream(behavior), **serializers)
    return handler


def _as_async_generator(behavior: Any) -> Any:
    """A streaming behaviour as an async generator, which the wrappers iterate.

    Some write their answers with `context.write` from a coroutine instead
    (grpc's own Health/Watch): those become a generator that yields nothing of
    its own while the coroutine writes."""
    if not inspect.iscoroutinefunction(behavior):
        return behavior

    async def written(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await behavior(request, context)
        return
        yield  # an async generator

    return written
