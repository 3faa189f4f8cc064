"""Calls described, not made (sans-IO): what the blocking and asyncio clients share.

Every client method is one function that builds its request and says how to
read the answer (`_session_calls`, `_delivery_calls`); it returns a `Call` (one
unary RPC) or `Pages` (a list, page by page) and performs no I/O. The clients
only perform them: `BaseClient` blocking, `AsyncBaseClient` awaited (`_base`),
each with its own `run` and `iterate`. A request is therefore built in one
place, and the two clients cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

_Out = TypeVar("_Out")
_Item = TypeVar("_Item")


def _whole(answer: Any) -> Any:
    return answer


@dataclass(frozen=True)
class Call(Generic[_Out]):
    """One unary call: the stub method's name, its request, and what of the answer
    the client method returns.

    `request_id`, `timeout_s` and `attempts` are `BaseClient._call`'s. With
    `short_deadline`, the client's `best_effort_timeout_s` is the deadline. With
    `fallback`, a failure (any exception) is answered by it instead of raised.
    `unbuilt` is the error of a request that could not be built: the call fails
    with it, without going out.
    """

    method: str
    request: Any
    read: Callable[[Any], _Out] = _whole
    request_id: str = ""
    timeout_s: float | None = None
    attempts: int | None = None
    short_deadline: bool = False
    fallback: Callable[[Exception], _Out] | None = None
    unbuilt: Exception | None = None

    @property
    def retries(self) -> dict[str, Any]:
        """`BaseClient._call`'s keywords for this call's attempts."""
        return {"request_id": self.request_id, "attempts": self.attempts}

    def failed(self, error: Exception) -> _Out:
        """The answer to a failed call: its fallback's, else the error raised."""
        if self.fallback is None:
            raise error
        return self.fallback(error)


@dataclass(frozen=True)
class Pages(Generic[_Item]):
    """A listing: the stub method, its first request (the page token is advanced in
    it, filters kept), and the items of one page."""

    method: str
    request: Any
    items: Callable[[Any], Iterable[_Item]]
