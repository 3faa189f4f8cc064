"""The platform adapter contract: what a chat platform offers either gateway.

Required: `name`, `connect()` and `send(chat_id, thread_id, text, idempotency_key)`.
That is enough everywhere, recovery included. Two capabilities are optional,
read with `getattr`, and default to the safe answer:

- `idempotent_sends: bool` (default False): the platform drops a second send
  carrying the same idempotency key (Discord's `nonce`, LINE's
  `X-Line-Retry-Key`); the gateway passes the obligation id as that key. A
  recovered reply is then re-sent as is, without the marker.
- `was_delivered(idempotency_key) -> str | None` (default: unknown): the
  platform message id if a send with that key arrived, None if not or unknown.
  Asked before re-sending a recovered reply; an id settles the row without a
  send, None re-sends with `RECOVERED_MARKER`. Raising counts as unknown.

What the gateway calls, and when:

- `connect()` once at start, before the instance is registered; an adapter
  whose connect raises is left out of the instance's platforms (no claims
  for it) until `Gateway.reconnected(name)`.
- `send(...)` for each reply of a turn, after the reply was recorded in the
  ledger as ATTEMPTING, and for each reply it claims at boot and periodically
  (with the marker when the first send may have gone out).
- `was_delivered(key)` only for claimed replies, before re-sending them.

Errors of `send`: raise `SendFailed(message, retryable=..., retry_after_s=...)`.
Retryable failures come back through a claim after `retry_after_s` (a 429's
Retry-After) or the server's backoff, with the marker; `retryable=False`
abandons the reply (a bot blocked by the user). Any other exception means
"the send may or may not have gone out": it is logged and recorded as a
retryable failure, so the reply is retried with the marker.

Sync adapters (`PlatformAdapter`) serve `Gateway`; `AsyncGateway` takes async
ones (`AsyncPlatformAdapter`: `async def connect/send/was_delivered`, as in
python-telegram-bot, slack_sdk's AsyncWebClient, discord.py) and also sync
ones, whose calls it runs in a worker thread so they never block the loop.
"""

from __future__ import annotations

from typing import Any, Protocol


class SendFailed(Exception):
    """A platform refused a send. `retryable` tells the ledger whether to try again;
    `retry_after_s` is the platform's own delay (flood control), None: the server's."""

    def __init__(
        self, message: str, retryable: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class PlatformAdapter(Protocol):
    """A chat platform, blocking calls (see the module docstring for the contract)."""

    @property
    def name(self) -> str:
        """The platform's name ("slack", "telegram", ...), as in routing keys."""
        ...

    def connect(self) -> None: ...

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        """Sends; returns the platform's message id. Raises SendFailed."""
        ...


class AsyncPlatformAdapter(Protocol):
    """A chat platform, awaited calls (see the module docstring for the contract)."""

    @property
    def name(self) -> str: ...

    async def connect(self) -> None: ...

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        """Sends; returns the platform's message id. Raises SendFailed."""
        ...


def idempotent_sends(adapter: Any) -> bool:
    """The optional capability, False when the adapter does not declare it."""
    return bool(getattr(adapter, "idempotent_sends", False))


def can_tell_delivered(adapter: Any) -> bool:
    """Whether the adapter offers `was_delivered`; without it delivery is unknown."""
    return callable(getattr(adapter, "was_delivered", None))


__all__ = [
    "AsyncPlatformAdapter",
    "PlatformAdapter",
    "SendFailed",
    "can_tell_delivered",
    "idempotent_sends",
]
