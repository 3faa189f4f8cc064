"""What every Switchboard client shares: the channel, deadlines, errors, closing.

A client built on `BaseClient` owns a channel configured with its service's
gRPC service config (unless the caller brings one), gives every unary call a
deadline, and turns every `grpc.RpcError` into a `SwitchboardError`.

Calls that write carry a request id (AIP-155): one fresh UUID per logical call
(or the caller's), kept across every retry of it, so the server answers a
retry of a committed call from its record instead of writing again. Two layers
retry them, because neither alone covers a lost answer:

- the service config's retry policy resends the same serialized request (the
  same id) on UNAVAILABLE, e.g. a connection dropped before the answer came, at
  once and inside the call's deadline;
- `BaseClient._call` retries DEADLINE_EXCEEDED and UNAVAILABLE as new calls,
  each attempt with its own deadline (`timeout_s`). gRPC's policy cannot do
  that: the call's deadline covers all its attempts, so an answer that never
  comes (a black-holed connection, a stalled server) uses the whole deadline and
  DEADLINE_EXCEEDED is final; a per-attempt timeout is not available in every
  client (grpc-js has none).

`BaseClient` (blocking) and `AsyncBaseClient` (grpc.aio, for asyncio gateways)
share all of it: the channel options, the token, the request-id stamping and
the attempt schedule; each only performs the waits its own way.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from typing import Any, ClassVar, Generic, ParamSpec, Protocol, Self, TypeVar, overload

import grpc
from google.protobuf import duration_pb2

from switchboard_client._calls import Call, Pages
from switchboard_client._stream import AsyncStreamCalls, StreamCalls
from switchboard_client.errors import SwitchboardError, from_rpc_error

#: Ceiling for any call on a channel built from a service config; the per-call deadline
#: (`timeout_s`) is normally shorter and wins. A larger `timeout_s` is capped here.
MAX_CALL_TIMEOUT = "30s"

#: Retry transient outages only: UNAVAILABLE means the request never reached a server
#: that could act on it, or the connection broke; only idempotent methods get it.
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 4,
    "initialBackoff": "0.1s",
    "maxBackoff": "2s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}

#: Attempts of a call that writes (each with its own deadline), and the pause
#: before the second one (doubling, with jitter).
MUTATION_ATTEMPTS = 3
MUTATION_BACKOFF_S = 0.1
#: What a retry with the same request id may follow: the call may have run or not.
_RETRIED_WITH_REQUEST_ID = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
)

_Request = TypeVar("_Request")
_Response = TypeVar("_Response")
_Out = TypeVar("_Out")
_Item = TypeVar("_Item")
_P = ParamSpec("_P")


class _PageRequest(Protocol):
    page_token: str


class _Page(Protocol):
    @property
    def next_page_token(self) -> str: ...


_PageRequestT = TypeVar("_PageRequestT", bound=_PageRequest)
_PageT = TypeVar("_PageT", bound=_Page)


def service_config(
    service: str, retryable: Iterable[str], *, unbounded: Iterable[str] = ()
) -> dict[str, Any]:
    """A gRPC service config for `service` (plain JSON data).

    Every method gets `MAX_CALL_TIMEOUT` (the nameless entry covers methods added
    later, which stay unretried until reviewed); the `retryable` methods (reads,
    and writes that carry a request id) also get `RETRY_POLICY`. `unbounded`
    methods (long-lived streams) get an entry of their own without a timeout or a
    retry: gRPC takes the most specific entry whole.
    """
    entries: list[dict[str, Any]] = [
        {"name": [{"service": service}], "timeout": MAX_CALL_TIMEOUT},
        {
            "name": [{"service": service, "method": method} for method in retryable],
            "timeout": MAX_CALL_TIMEOUT,
            "retryPolicy": copy.deepcopy(RETRY_POLICY),
        },
    ]
    # CallStream (`_stream`) lives as long as the client: each carried call has its own deadline.
    streams = [{"service": service, "method": m} for m in [*unbounded, "CallStream"]]
    if streams:
        entries.append({"name": streams})
    return {"methodConfig": entries}


def _takes_request_id(request: Any) -> bool:
    descriptor = getattr(request, "DESCRIPTOR", None)
    return descriptor is not None and "request_id" in descriptor.fields_by_name


def stamp_request_id(request: Any, request_id: str) -> bool:
    """Gives a call that writes its request id (the caller's, else a fresh UUID);
    False for a read, which carries none and is not retried as a new call."""
    if not _takes_request_id(request):
        return False
    request.request_id = request_id or str(uuid.uuid4())
    return True


def attempt_pauses(attempts: int) -> Iterator[float | None]:
    """One item per attempt of a call that writes: the pause before the next
    attempt (doubling, with jitter), None for the last one."""
    pause = MUTATION_BACKOFF_S
    for _ in range(attempts - 1):
        yield pause * random.uniform(0.5, 1.0)
        pause *= 2
    yield None


def retried(error: SwitchboardError, pause: float | None) -> bool:
    """Whether a failed attempt of a call that writes is tried again (same id)."""
    return pause is not None and error.code in _RETRIED_WITH_REQUEST_ID


def channel_options(config: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]


def bearer(token: str | None) -> tuple[tuple[str, str], ...]:
    # A bearer token travels as call metadata, so it works on plaintext channels
    # too (call credentials would demand TLS).
    return (("authorization", f"Bearer {token}"),) if token else ()


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(round(seconds * 1e9))
    return value


class _Client:
    """What a blocking and an asyncio client hold alike: the settings and the stub.

    A subclass names its service's `SERVICE_CONFIG` and generated `STUB` class.
    """

    SERVICE_CONFIG: ClassVar[dict[str, Any]]
    STUB: ClassVar[type[Any]]

    def __init__(
        self,
        channel: Any,
        owns_channel: bool,
        timeout_s: float,
        best_effort_timeout_s: float,
        token: str | None,
        mutation_attempts: int,
    ) -> None:
        self.timeout_s = timeout_s
        self.best_effort_timeout_s = best_effort_timeout_s
        self.mutation_attempts = max(1, mutation_attempts)
        self._metadata = bearer(token)
        self._owns_channel = owns_channel
        self._channel = channel
        self._stub = self.STUB(channel)

    def _deadline(self, call: Call[Any]) -> float | None:
        return self.best_effort_timeout_s if call.short_deadline else call.timeout_s

    def _method(self, call: Call[Any] | Pages[Any]) -> Any:
        """The stub's method for a call (the same name on both kinds of stub); the
        error of a call whose request could not be built is raised here."""
        if isinstance(call, Call) and call.unbuilt is not None:
            raise call.unbuilt
        return getattr(self._stub, call.method)


class BaseClient(_Client):
    """A channel plus the call discipline; subclasses name a service config and a stub
    and list their methods (`blocking(...)` over the `_calls` builders).

    Thread-safe, like its channel.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        best_effort_timeout_s: float = 2.0,
        channel: grpc.Channel | None = None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        """`target` is "host:port"; pass `channel` to bring your own (TLS, interceptors),
        `token` for a server with authentication on.

        A channel passed in stays the caller's: `close()` leaves it open, and the
        service config is not applied to it. `mutation_attempts` bounds the attempts
        of a call that writes (1: no retry loop); `best_effort_timeout_s` is the
        deadline of the calls that must not hold anything up (`record_best_effort`).
        """
        owned = channel is None
        if channel is None:
            options = channel_options(self.SERVICE_CONFIG)
            channel = grpc.insecure_channel(target, options=options)
        super().__init__(channel, owned, timeout_s, best_effort_timeout_s, token, mutation_attempts)
        self._stream_calls = StreamCalls(self._channel, self._metadata)

    def close(self) -> None:
        """Closes the channel this client created (not one passed in)."""
        self._stream_calls.close()
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, call: Call[_Out]) -> _Out:
        """Makes a described call and reads its answer."""
        try:
            method = self._method(call)
            answer = self._call(method, call.request, self._deadline(call), **call.retries)
        except Exception as error:
            return call.failed(error)
        return call.read(answer)

    def _iterate(self, pages: Pages[_Item]) -> Iterator[_Item]:
        """A described listing's items, fetched lazily as iteration goes."""
        for page in self._pages(self._method(pages), pages.request):
            yield from pages.items(page)

    def _call(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout_s: float | None = None,
        *,
        request_id: str = "",
        attempts: int | None = None,
    ) -> _Response:
        """Every call gets a deadline: a hung server must never hang a gateway.

        A request with a `request_id` field (a call that writes) gets `request_id`,
        or a fresh UUID, and is retried with it on UNAVAILABLE and DEADLINE_EXCEEDED,
        a new deadline per attempt.
        """
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if not stamp_request_id(request, request_id):
            return self._attempt(method, request, timeout)
        for pause in attempt_pauses(attempts or self.mutation_attempts):
            try:
                return self._attempt(method, request, timeout)
            except SwitchboardError as error:
                if not retried(error, pause):
                    raise
            time.sleep(pause or 0.0)
        raise AssertionError("unreachable")

    def _attempt(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float,
    ) -> _Response:
        return self._stream_calls.attempt(
            request, timeout, lambda: self._unary_attempt(method, request, timeout)
        )

    def _unary_attempt(
        self,
        method: grpc.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float,
    ) -> _Response:
        try:
            return method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    def _pages(
        self, method: grpc.UnaryUnaryMultiCallable[_PageRequestT, _PageT], request: _PageRequestT
    ) -> Iterator[_PageT]:
        """Every page of a list, fetched lazily as iteration goes, filters kept.

        Each page is its own call with its own deadline.
        """
        while True:
            page = self._call(method, request)
            yield page
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token


class AsyncBaseClient(_Client):
    """`BaseClient` on a grpc.aio channel: the same deadlines, request ids, retries,
    token and errors, awaited. Use it from one event loop (the channel's)."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        best_effort_timeout_s: float = 2.0,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        """As `BaseClient`; create it inside the running event loop."""
        owned = channel is None
        if channel is None:
            channel = grpc.aio.insecure_channel(
                target, options=channel_options(self.SERVICE_CONFIG)
            )
        super().__init__(channel, owned, timeout_s, best_effort_timeout_s, token, mutation_attempts)
        self._stream_calls = AsyncStreamCalls(self._channel, self._metadata)

    async def close(self) -> None:
        """Closes the channel this client created (not one passed in)."""
        self._stream_calls.close()
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _run(self, call: Call[_Out]) -> _Out:
        """`BaseClient._run`, awaited."""
        try:
            method = self._method(call)
            answer = await self._call(method, call.request, self._deadline(call), **call.retries)
        except Exception as error:
            return call.failed(error)
        return call.read(answer)

    async def _iterate(self, pages: Pages[_Item]) -> AsyncIterator[_Item]:
        """A described listing's items, fetched lazily as iteration goes."""
        async for page in self._pages(self._method(pages), pages.request):
            for item in pages.items(page):
                yield item

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout_s: float | None = None,
        *,
        request_id: str = "",
        attempts: int | None = None,
    ) -> _Response:
        """`BaseClient._call`, awaited."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if not stamp_request_id(request, request_id):
            return await self._attempt(method, request, timeout)
        for pause in attempt_pauses(attempts or self.mutation_attempts):
            try:
                return await self._attempt(method, request, timeout)
            except SwitchboardError as error:
                if not retried(error, pause):
                    raise
            await asyncio.sleep(pause or 0.0)
        raise AssertionError("unreachable")

    async def _attempt(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float,
    ) -> _Response:
        return await self._stream_calls.attempt(
            request, timeout, lambda: self._unary_attempt(method, request, timeout)
        )

    async def _unary_attempt(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_Request, _Response],
        request: _Request,
        timeout: float,
    ) -> _Response:
        try:
            return await method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    async def _pages(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[_PageRequestT, _PageT],
        request: _PageRequestT,
    ) -> AsyncIterator[_PageT]:
        """Every page of a list, fetched lazily as iteration goes, filters kept."""
        while True:
            page = await self._call(method, request)
            yield page
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token


# -- client methods from the `_calls` builders ---------------------------------------------

_Built = TypeVar("_Built")
_Done = TypeVar("_Done")


class _Method(Generic[_P, _Built, _Done]):
    """A client method made of a builder (its signature and docstring, once) and a
    way to perform what it builds (blocking or awaited)."""

    def __init__(
        self, build: Callable[_P, _Built], perform: Callable[[Any, _Built], _Done]
    ) -> None:
        self._build = build
        self._perform = perform
        self.__name__ = self.__qualname__ = build.__name__
        self.__doc__ = build.__doc__
        # What help() and inspect show: the builder's parameters (its return is the
        # described call, not what the method answers).
        self.__signature__ = inspect.signature(build).replace(
            return_annotation=inspect.Signature.empty
        )

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.__name__ = name
        self.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Self: ...

    @overload
    def __get__(self, client: _Client, owner: type[Any]) -> Callable[_P, _Done]: ...

    def __get__(self, client: _Client | None, owner: type[Any]) -> Self | Callable[_P, _Done]:
        if client is None:
            return self
        build, perform = self._build, self._perform

        def method(*args: _P.args, **kwargs: _P.kwargs) -> _Done:
            return perform(client, build(*args, **kwargs))

        method.__name__, method.__qualname__ = self.__name__, self.__qualname__
        method.__doc__ = self.__doc__
        method.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return method

    def __call__(self, client: _Client, /, *args: _P.args, **kwargs: _P.kwargs) -> _Done:
        """Called on the class with the client first, as a plain method would be."""
        return self._perform(client, self._build(*args, **kwargs))


def blocking(build: Callable[_P, Call[_Out]]) -> _Method[_P, Call[_Out], _Out]:
    """A `BaseClient` method making the call `build` describes."""
    return _Method(build, BaseClient._run)


def blocking_pages(build: Callable[_P, Pages[_Item]]) -> _Method[_P, Pages[_Item], Iterator[_Item]]:
    """A `BaseClient` method iterating the listing `build` describes."""
    return _Method(build, BaseClient._iterate)


def awaited(
    build: Callable[_P, Call[_Out]],
) -> _Method[_P, Call[_Out], Coroutine[Any, Any, _Out]]:
    """An `AsyncBaseClient` method awaiting the call `build` describes."""
    return _Method(build, AsyncBaseClient._run)


def awaited_pages(
    build: Callable[_P, Pages[_Item]],
) -> _Method[_P, Pages[_Item], AsyncIterator[_Item]]:
    """An `AsyncBaseClient` method iterating the listing `build` describes."""
    return _Method(build, AsyncBaseClient._iterate)
