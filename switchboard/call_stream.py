"""CallStream: many unary calls carried over one bidirectional stream.

A gateway with several writes in flight sends them over one stream instead of one
HTTP/2 call each; the server runs each carried call concurrently (so that the
runner's group commit takes the ones that arrive together into one transaction)
and answers each, with its correlation id, as soon as it has committed.

A carried call is served by the very handler its unary RPC has, through the same
interceptor chain the server runs for that RPC (`InterceptorChain.handler_for`):
scope checks, deadlines, request ids, validation, error mapping, metrics and the
access log are the unary ones, not a copy of them. The stream's token is checked
once when the stream opens (by the chain, as for any call); each carried call is
then authorised by the chain as its unary twin is, with the stream's metadata.
What the chain would have sent as trailers (`context.abort`) becomes the answer's
`CallStatus`, whose fields are google.rpc.Status's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, NamedTuple

import grpc
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from switchboard import errors
from switchboard.grpc_errors import rich_status
from switchboard.interceptor_chain import InterceptorChain

log = logging.getLogger(__name__)

#: What a registered service's generated `add_*Servicer_to_server` is called with.
Register = Callable[[Any], None]
_DETAILS_KEY = "grpc-status-details-bin"
#: Calls one stream runs at once (the default bound of calls on one connection).
MAX_CALLS_IN_FLIGHT = 1000
#: The oneof of a CallStream request holding the carried call, and of its answer.
CALL_ONEOF, RESULT_ONEOF = "call", "result"


class _Details(NamedTuple):
    """A carried call's `grpc.HandlerCallDetails`: its unary method, the stream's metadata."""

    method: str
    invocation_metadata: Any


class _Recorder:
    """Stands in for a server while generated code registers a servicer: keeps its handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, _handlers: Any) -> None:
        """The registered method handlers below hold the same handlers."""

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.handlers.update({f"/{service}/{name}": h for name, h in handlers.items()})


class _CallEnded(Exception):
    """The carried call was answered with an error (`_CarriedContext.abort`)."""


class _CarriedContext:
    """The servicer context of one carried call: the stream's metadata and peer, the
    carried request as the call's one message, the tighter of the stream's and the
    call's own deadline, and an `abort` that keeps the status instead of ending the
    stream."""

    def __init__(self, stream: Any, request: Message, deadline: float | None) -> None:
        self._stream = stream
        self._request: Message | None = request
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self.details = ""
        self.trailers: tuple[tuple[str, str | bytes], ...] = ()

    def invocation_metadata(self) -> Any:
        return self._stream.invocation_metadata()

    def peer(self) -> str:
        return str(self._stream.peer())

    def time_remaining(self) -> float | None:
        stream_left = self._stream.time_remaining()
        if self._deadline is None:
            return stream_left  # type: ignore[no-any-return]
        own_left = max(0.0, self._deadline - time.monotonic())
        return own_left if stream_left is None else min(own_left, float(stream_left))

    async def read(self) -> Any:
        request, self._request = self._request, None
        return grpc.aio.EOF if request is None else request

    def code(self) -> grpc.StatusCode | None:
        return self._code

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> None:
        self._code, self.details = code, details
        self.trailers = tuple(trailing_metadata or ())
        raise grpc.aio.AbortError(details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        self.trailers = tuple(metadata)


class CarriedCalls:
    """Serves one service's CallStream by running its unary handlers per message."""

    def __init__(
        self, service: ServiceDescriptor, register: Register, response_class: type[Message]
    ) -> None:
        """`register(server)`: registers the service's servicer on `server` (the
        generated `add_*Servicer_to_server` with the servicer bound);
        `response_class`: the CallStreamResponse, whose oneof `result` names each
        carried call's response field as its request's field in the request's `call`."""
        self._response_class = response_class
        self._status_class: Any = type(getattr(response_class(), "error"))  # noqa: B009
        recorder = _Recorder()
        register(recorder)
        self._handlers = recorder.handlers
        request_class = service.methods_by_name["CallStream"].input_type
        self._methods = {
            field.name: self._method_of(service, field.message_type)
            for field in request_class.oneofs_by_name[CALL_ONEOF].fields
        }
        self._chain: InterceptorChain | None = None
        self._readers: set[asyncio.Task[None]] = set()
        #: Readers stopped on purpose (a drain, a stream's age): they end the stream OK.
        self._stopped: set[asyncio.Task[None]] = set()
        self._draining = False
        #: A stream ends (as in a drain) after this many seconds, None: never.
        self.max_stream_age_s: float | None = None

    @staticmethod
    def _method_of(service: ServiceDescriptor, request_type: Any) -> str:
        for method in service.methods:
            if method.input_type is request_type:
                return f"/{service.full_name}/{method.name}"
        raise LookupError(f"{service.full_name} has no method taking {request_type.full_name}")

    def serve_through(self, chain: InterceptorChain) -> None:
        """Carried calls run through the server's own interceptor chain (set at start)."""
        self._chain = chain

    def drain(self) -> None:
        """The server is stopping: every open stream stops reading calls, answers the
        ones in flight and ends (OK); its caller sends the rest again elsewhere, by
        request id. New streams end at once."""
        self._draining = True
        for reader in list(self._readers):
            self._stop(reader)

    def _stop(self, reader: asyncio.Task[None]) -> None:
        self._stopped.add(reader)
        reader.cancel()

    async def serve(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Message]:
        """Answers each carried call as it finishes, until the caller half-closes (or
        the server drains) and every call in flight has been answered."""
        if self._draining:
            return
        answers: asyncio.Queue[Message | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        reader = asyncio.create_task(self._read(requests, context, answers, running))
        self._readers.add(reader)
        # Ended before the server's max connection age, whose GOAWAY grace would cut
        # the calls in flight: the caller opens another stream (on a new connection).
        aged = None
        if self.max_stream_age_s is not None:
            aged = asyncio.get_running_loop().call_later(self.max_stream_age_s, self._stop, reader)
        try:
            while (answer := await answers.get()) is not None:
                yield answer
            await reader  # the stream's own failure, if reading failed
        finally:
            if aged is not None:
                aged.cancel()
            self._readers.discard(reader)
            self._stopped.discard(reader)
            reader.cancel()
            for task in running:
                task.cancel()

    async def _read(
        self,
        requests: AsyncIterator[Any],
        context: Any,
        answers: asyncio.Queue[Message | None],
        running: set[asyncio.Task[None]],
    ) -> None:
        """Starts each call as it arrives; when the requests end (or a drain stops
        the reading), waits for the calls in flight, then marks the end of answers."""

        # A stream's calls in flight are bounded as a connection's calls are: past
        # the bound nothing more is read, and HTTP/2 flow control holds the caller.
        room = asyncio.Semaphore(MAX_CALLS_IN_FLIGHT)

        async def answer(request: Any) -> None:
            try:
                answers.put_nowait(await self.answer(request, context))
            finally:
                room.release()

        try:
            async for request in requests:
                task = asyncio.create_task(answer(request))
                running.add(task)
                task.add_done_callback(running.discard)
                await room.acquire()
        except asyncio.CancelledError:
            if asyncio.current_task() not in self._stopped:
                raise
        finally:
            if running:
                await asyncio.gather(*running, return_exceptions=True)
            answers.put_nowait(None)

    async def answer(self, request: Any, stream: Any) -> Message:
        """One carried call's answer: its unary handler's response, or its error."""
        kind = request.WhichOneof(CALL_ONEOF)
        if kind is None:
            refusal = errors.InvalidArgument(
                CALL_ONEOF, f"carries no call: set one of {', '.join(self._methods)}"
            )
            return self._refused(request.correlation_id, refusal)
        deadline = None
        if request.HasField("timeout"):
            deadline = time.monotonic() + request.timeout.ToTimedelta().total_seconds()
        carried = getattr(request, kind)
        context = _CarriedContext(stream, carried, deadline)
        try:
            async with asyncio.timeout_at(self._loop_time(deadline)):
                response = await self._run(self._methods[kind], carried, context)
        except grpc.aio.AbortError:
            return self._status(request.correlation_id, context)
        except TimeoutError:
            late = errors.DeadlineExceeded(
                "DEADLINE_EXCEEDED", "the call's timeout passed before it finished"
            )
            return self._refused(request.correlation_id, late)
        answer = self._response_class(correlation_id=request.correlation_id)
        getattr(answer, kind).CopyFrom(response)
        return answer

    @staticmethod
    def _loop_time(deadline: float | None) -> float | None:
        if deadline is None:
            return None
        return asyncio.get_running_loop().time() + (deadline - time.monotonic())

    async def _run(self, method: str, request: Message, context: _CarriedContext) -> Any:
        if self._chain is None:
            # Never without the chain: it is what checks the caller's scope.
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, "this server is not serving CallStream yet"
            )
        assert self._chain is not None
        handler = self._chain.handler_for(
            _Details(method, context.invocation_metadata()),  # type: ignore[arg-type]
            self._handlers[method],
        )
        behavior: Any = handler.unary_unary or handler.stream_unary
        return await behavior(request, context)

    def _status(self, correlation_id: int, context: _CarriedContext) -> Message:
        """The answer for a call the chain ended with `context.abort`: its rich status as
        sent in the trailers, or its code and message when it had no details."""
        details = next((v for k, v in context.trailers if k == _DETAILS_KEY), None)
        if isinstance(details, bytes):
            error = self._status_class.FromString(details)
        else:
            code = context.code() or grpc.StatusCode.UNKNOWN
            error = self._status_class(code=code.value[0], message=context.details)
        return self._response_class(correlation_id=correlation_id, error=error)

    def _refused(self, correlation_id: int, refusal: errors.DomainError) -> Message:
        """The answer for a call the stream itself refuses, as the chain maps errors."""
        status = rich_status(refusal)
        context = _CarriedContext(None, self._response_class(), None)
        context.trailers = tuple(status.trailing_metadata)
        return self._status(correlation_id, context)
