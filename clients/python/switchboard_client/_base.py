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
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import grpc
from google.protobuf import duration_pb2

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


class BaseClient:
    """A channel plus the call discipline; subclasses add a stub and typed methods.

    Thread-safe, like its channel.
    """

    def __init__(
        self,
        target: str,
        *,
        config: dict[str, Any],
        timeout_s: float,
        channel: grpc.Channel | None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        """`target` is "host:port"; pass `channel` to bring your own (TLS, interceptors).

        A channel passed in stays the caller's: `close()` leaves it open, and
        `config` is not applied to it. `mutation_attempts` bounds the attempts of
        a call that writes (1: no retry loop).
        """
        self.timeout_s = timeout_s
        self.mutation_attempts = max(1, mutation_attempts)
        self._metadata = bearer(token)
        self._owns_channel = channel is None
        self._channel = (
            channel
            if channel is not None
            else grpc.insecure_channel(target, options=channel_options(config))
        )
        self._stream_calls = StreamCalls(self._channel, self._metadata)

    def close(self) -> None:
        """Closes the channel this client created (not one passed in)."""
        self._stream_calls.close()
        if self._owns_channel:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

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


class AsyncBaseClient:
    """`BaseClient` on a grpc.aio channel: the same deadlines, request ids, retries,
    token and errors, awaited. Use it from one event loop (the channel's)."""

    def __init__(
        self,
        target: str,
        *,
        config: dict[str, Any],
        timeout_s: float,
        channel: grpc.aio.Channel | None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        """As `BaseClient`; create it inside the running event loop."""
        self.timeout_s = timeout_s
        self.mutation_attempts = max(1, mutation_attempts)
        self._metadata = bearer(token)
        self._owns_channel = channel is None
        self._channel = (
            channel
            if channel is not None
            else grpc.aio.insecure_channel(target, options=channel_options(config))
        )
        self._stream_calls = AsyncStreamCalls(self._channel, self._metadata)

    async def close(self) -> None:
        """Closes the channel this client created (not one passed in)."""
        self._stream_calls.close()
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

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
