"""Writes carried over the service's CallStream while other calls are in flight.

A client whose calls overlap (a gateway serving several chats from one client)
sends each write the service's CallStream carries (appends, inbox posts, the ledger
transitions) over one bidirectional stream instead of one unary call each: one
HTTP/2 stream for all of them, and the server commits the ones that arrive together
in one transaction. A lone call stays unary, the simple path, and so does every
call when the server has no CallStream (UNIMPLEMENTED: remembered per service).

A carried call answers exactly as its unary twin: the same response, the same
`SwitchboardError` (code, reason, fields), the same request id (a carried call that
failed UNAVAILABLE, because its stream broke, is retried by `_call` with its id,
like a unary one). Each has its attempt's deadline, sent with it as its `timeout`.
A stream the server ends cleanly (it is stopping, or the stream is old: servers end
them before their connection's age limit) has answered every call it read; the
calls it left unanswered go again on a new stream, unnoticed.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.rpc import status_pb2

from switchboard_client.errors import SwitchboardError, from_rpc_error, from_status

R = TypeVar("R")
Metadata = tuple[tuple[str, str], ...]
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_END = object()


@dataclass(frozen=True)
class Route:
    """How one kind of request travels on its service's CallStream."""

    path: str
    request_class: Any
    response_class: Any
    #: The field of CallStreamRequest's `call` (and CallStreamResponse's `result`).
    field: str


_ROUTES: dict[str, Route | None] = {}


def route_of(request: Any) -> Route | None:
    """The CallStream route of `request`'s kind; None when no CallStream carries it."""
    descriptor = getattr(request, "DESCRIPTOR", None)
    if descriptor is None:
        return None
    name = descriptor.full_name
    if name not in _ROUTES:
        _ROUTES[name] = _find_route(descriptor)
    return _ROUTES[name]


def _find_route(descriptor: Any) -> Route | None:
    for service in descriptor.file.services_by_name.values():
        method = service.methods_by_name.get("CallStream")
        if method is None:
            continue
        for field in method.input_type.oneofs_by_name["call"].fields:
            if field.message_type.full_name == descriptor.full_name:
                return Route(
                    f"/{service.full_name}/CallStream",
                    message_factory.GetMessageClass(method.input_type),
                    message_factory.GetMessageClass(method.output_type),
                    field.name,
                )
    return None


def _carried(route: Route, correlation_id: int, request: Any, timeout: float) -> Any:
    carried = route.request_class(correlation_id=correlation_id)
    carried.timeout.FromNanoseconds(round(timeout * 1e9))
    getattr(carried, route.field).CopyFrom(request)
    return carried


def _answer(route: Route, answer: Any) -> Any:
    """The carried call's response; its error raised as the unary call's would be."""
    if answer.WhichOneof("result") == "error":
        status = status_pb2.Status.FromString(answer.error.SerializeToString())
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        raise from_status(code, status.message, status)
    return getattr(answer, route.field)


#: Times a call is sent again on a new stream after its stream ended unanswered.
RESENDS = 3


class _Unanswered(Exception):
    """The stream ended cleanly (the server stopping, or ending an old stream) before
    this call was answered: the server answers every call it read before it ends a
    stream, so this one never ran. It goes again on a new stream."""


def _late(timeout: float) -> SwitchboardError:
    return SwitchboardError(
        grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer on the call stream within {timeout:g}s"
    )


class _Stream:
    """One open CallStream of a blocking client (`route` names its service): a thread
    reads the answers."""

    def __init__(self, channel: grpc.Channel, route: Route, metadata: Metadata) -> None:
        self.broken: Exception | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count()
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        call = channel.stream_stream(
            route.path,
            request_serializer=route.request_class.SerializeToString,
            response_deserializer=route.response_class.FromString,
        )
        self._answers = call(iter(self._requests.get, _END), metadata=metadata)
        threading.Thread(target=self._read, name="switchboard-call-stream", daemon=True).start()

    def call(self, route: Route, request: Any, timeout: float) -> Any:
        future: Future[Any] = Future()
        with self._lock:
            if self.broken is not None:
                raise self.broken
            correlation_id = next(self._ids)
            self._pending[correlation_id] = future
        self._requests.put(_carried(route, correlation_id, request, timeout))
        try:
            return _answer(route, future.result(timeout))
        except FutureTimeout:
            raise _late(timeout) from None
        finally:
            with self._lock:
                self._pending.pop(correlation_id, None)

    def _read(self) -> None:
        error: Exception = _Unanswered()
        try:
            for answer in self._answers:
                with self._lock:
                    future = self._pending.pop(answer.correlation_id, None)
                if future is not None:
                    future.set_result(answer)
        except grpc.RpcError as failed:
            error = from_rpc_error(failed)
        with self._lock:
            self.broken, pending, self._pending = error, self._pending, {}
        for future in pending.values():
            future.set_exception(error)

    def close(self) -> None:
        self._requests.put(_END)


class StreamCalls:
    """The blocking client's carrier: counts calls in flight, carries writes while
    others are in flight, keeps one stream per service open."""

    def __init__(self, channel: grpc.Channel, metadata: Metadata) -> None:
        self._channel = channel
        self._metadata = metadata
        self._lock = threading.Lock()
        self._in_flight = 0
        self._streams: dict[str, _Stream] = {}
        self._unimplemented: set[str] = set()

    def attempt(self, request: Any, timeout: float, unary: Callable[[], R]) -> R:
        """One attempt of a call: over the stream when it carries this kind of call and
        another call is in flight, else `unary()`."""
        route = route_of(request)
        with self._lock:
            others = self._in_flight
            self._in_flight += 1
        try:
            if route is None or others == 0 or route.path in self._unimplemented:
                return unary()
            for _ in range(RESENDS):
                try:
                    result: R = self._stream(route).call(route, request, timeout)
                    return result
                except _Unanswered:
                    continue  # on a new stream
                except SwitchboardError as error:
                    if error.code != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    self._unimplemented.add(route.path)  # a server without CallStream
                    break
            return unary()
        finally:
            with self._lock:
                self._in_flight -= 1

    def _stream(self, route: Route) -> _Stream:
        with self._lock:
            stream = self._streams.get(route.path)
            if stream is None or stream.broken is not None:
                stream = self._streams[route.path] = _Stream(self._channel, route, self._metadata)
            return stream

    def close(self) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()


def _expire(future: asyncio.Future[Any], timeout: float) -> None:
    if not future.done():
        future.set_exception(_late(timeout))


class _AsyncStream:
    """One open CallStream of an asyncio client (`route` names its service): a task
    reads the answers."""

    def __init__(self, channel: grpc.aio.Channel, route: Route, metadata: Metadata) -> None:
        self.broken: Exception | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._requests: asyncio.Queue[Any] = asyncio.Queue()
        call = channel.stream_stream(
            route.path,
            request_serializer=route.request_class.SerializeToString,
            response_deserializer=route.response_class.FromString,
        )
        self._call = call(self._outgoing(), metadata=metadata)
        self._reader = asyncio.create_task(self._read())

    async def _outgoing(self) -> AsyncIterator[Any]:
        while (request := await self._requests.get()) is not _END:
            yield request

    async def call(self, route: Route, request: Any, timeout: float) -> Any:
        if self.broken is not None:
            raise self.broken
        correlation_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future = self._pending[correlation_id] = loop.create_future()
        self._requests.put_nowait(_carried(route, correlation_id, request, timeout))
        # A timer, not wait_for: wait_for costs a task per call, the timer a handle.
        timer = loop.call_later(timeout, _expire, future, timeout)
        try:
            return _answer(route, await future)
        finally:
            timer.cancel()
            self._pending.pop(correlation_id, None)

    async def _read(self) -> None:
        error: Exception = _Unanswered()
        try:
            async for answer in self._call:
                future = self._pending.pop(answer.correlation_id, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except grpc.RpcError as failed:
            error = from_rpc_error(failed)
        self.broken, pending, self._pending = error, self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def close(self) -> None:
        self._requests.put_nowait(_END)


class AsyncStreamCalls:
    """`StreamCalls` for an asyncio client (one event loop)."""

    def __init__(self, channel: grpc.aio.Channel, metadata: Metadata) -> None:
        self._channel = channel
        self._metadata = metadata
        self._in_flight = 0
        self._streams: dict[str, _AsyncStream] = {}
        self._unimplemented: set[str] = set()

    async def attempt(self, request: Any, timeout: float, unary: Callable[[], Awaitable[R]]) -> R:
        """As `StreamCalls.attempt`, awaited."""
        route = route_of(request)
        others = self._in_flight
        self._in_flight += 1
        try:
            if route is None or others == 0 or route.path in self._unimplemented:
                return await unary()
            for _ in range(RESENDS):
                try:
                    result: R = await self._stream(route).call(route, request, timeout)
                    return result
                except _Unanswered:
                    continue  # on a new stream
                except SwitchboardError as error:
                    if error.code != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    self._unimplemented.add(route.path)
                    break
            return await unary()
        finally:
            self._in_flight -= 1

    def _stream(self, route: Route) -> _AsyncStream:
        stream = self._streams.get(route.path)
        if stream is None or stream.broken is not None:
            stream = self._streams[route.path] = _AsyncStream(self._channel, route, self._metadata)
        return stream

    def close(self) -> None:
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.close()
