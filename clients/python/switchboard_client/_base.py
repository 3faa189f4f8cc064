"""What every Switchboard client shares: the channel, deadlines, errors, closing.

A client built on `BaseClient` owns a channel configured with its service's
gRPC service config (unless the caller brings one), gives every unary call a
deadline, and turns every `grpc.RpcError` into a `SwitchboardError`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import grpc
from google.protobuf import duration_pb2

from switchboard_client.errors import from_rpc_error

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
    later, which stay unretried until reviewed); the `retryable` methods also get
    `RETRY_POLICY`. `unbounded` methods (long-lived streams) get an entry of their
    own without a timeout or a retry: gRPC takes the most specific entry whole.
    """
    entries: list[dict[str, Any]] = [
        {"name": [{"service": service}], "timeout": MAX_CALL_TIMEOUT},
        {
            "name": [{"service": service, "method": method} for method in retryable],
            "timeout": MAX_CALL_TIMEOUT,
            "retryPolicy": copy.deepcopy(RETRY_POLICY),
        },
    ]
    streams = [{"service": service, "method": method} for method in unbounded]
    if streams:
        entries.append({"name": streams})
    return {"methodConfig": entries}


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
    ) -> None:
        """`target` is "host:port"; pass `channel` to bring your own (TLS, interceptors).

        A channel passed in stays the caller's: `close()` leaves it open, and
        `config` is not applied to it.
        """
        self.timeout_s = timeout_s
        # A bearer token travels as call metadata, so it works on plaintext
        # channels too (call credentials would demand TLS).
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self._owns_channel = channel is None
        self._channel = (
            channel
            if channel is not None
            else grpc.insecure_channel(
                target,
                options=[
                    ("grpc.service_config", json.dumps(config)),
                    ("grpc.enable_retries", 1),
                ],
            )
        )

    def close(self) -> None:
        """Closes the channel this client created (not one passed in)."""
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
    ) -> _Response:
        """Every call gets a deadline: a hung server must never hang a gateway."""
        try:
            return method(
                request,
                timeout=self.timeout_s if timeout_s is None else timeout_s,
                metadata=self._metadata,
            )
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
