"""A loopback chat platform for tests: it keeps what it was sent, and can be told
to fail, hang or kill its own process in the middle of a send. `AsyncLoopbackPlatform`
is the same platform for the asyncio gateway."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass, field

from switchboard_client.adapters import SendFailed


@dataclass
class Sent:
    chat_id: str
    thread_id: str
    text: str
    key: str
    message_id: str


@dataclass
class LoopbackPlatform:
    name: str = "loopback"
    idempotent_sends: bool = False
    #: "ok", "fail" (retryable), "reject" (not retryable), "hang" or "die".
    mode: str = "ok"
    sent: list[Sent] = field(default_factory=list)
    connected: bool = False
    release: threading.Event = field(default_factory=threading.Event)

    def connect(self) -> None:
        self.connected = True

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        if self.mode == "fail":
            raise SendFailed("503 from the loopback platform", retryable=True)
        if self.mode == "reject":
            raise SendFailed("403: bot was blocked by the user", retryable=False)
        if self.mode == "hang":
            self.release.wait()
        if self.mode == "die":
            # The process dies mid-send, after the ledger said ATTEMPTING: the
            # message may or may not have left (here it has not).
            os.kill(os.getpid(), signal.SIGKILL)
        if self.idempotent_sends and any(s.key == idempotency_key for s in self.sent):
            return next(s.message_id for s in self.sent if s.key == idempotency_key)
        message_id = f"{self.name}-{len(self.sent) + 1}"
        self.sent.append(Sent(chat_id, thread_id, text, idempotency_key, message_id))
        return message_id

    def was_delivered(self, idempotency_key: str) -> str | None:
        return None  # this platform cannot tell; the marker has to say it


@dataclass
class AsyncLoopbackPlatform:
    """A `LoopbackPlatform` behind async calls, for `AsyncGateway`: the same modes,
    and what it was sent is in `platform.sent`."""

    platform: LoopbackPlatform

    @property
    def name(self) -> str:
        return self.platform.name

    @property
    def idempotent_sends(self) -> bool:
        return self.platform.idempotent_sends

    async def connect(self) -> None:
        self.platform.connect()

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        if self.platform.mode == "hang":
            await asyncio.to_thread(self.platform.release.wait)  # never block the loop
        await asyncio.sleep(0)  # a real send yields to the loop on its way out
        return self.platform.send(chat_id, thread_id, text, idempotency_key)

    async def was_delivered(self, idempotency_key: str) -> str | None:
        return self.platform.was_delivered(idempotency_key)
