"""Two transports in the box: a terminal REPL and a cron-style scheduler.

Both are routed like any other transport: the REPL by its conversation id
(`agent:<agent>:repl:<id>`), each cron job by its name (`agent:<agent>:cron:<job>`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.gateway import Gateway, Inbound


@dataclass
class ReplPlatform:
    """The terminal as a platform: replies are printed."""

    out: TextIO
    name: str = "repl"
    idempotent_sends: bool = False
    _count: int = 0

    def connect(self) -> None:
        pass

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        self._count += 1
        print(f"agent> {text}", file=self.out, flush=True)
        return f"repl-{self._count}"

    def was_delivered(self, idempotency_key: str) -> str | None:
        return None


def run_repl(gateway: Gateway, lines: Iterable[str], conversation_id: str = "default") -> None:
    """Feeds lines to the agent; "/new" starts a fresh session, "/quit" ends."""
    source = pb.Source(transport="repl", conversation_id=conversation_id)
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            return
        if text == "/new":
            session = gateway.sessions.resolve(
                gateway.agent, transport="repl", conversation_id=conversation_id
            ).session
            gateway.sessions.reset(gateway.agent, session.session_id, "/new")
            continue
        gateway.handle(Inbound(source, text, message_ref=f"repl-line-{number}"))


@dataclass(frozen=True)
class CronJob:
    """A prompt the agent gets every `every_s` seconds; the reply goes to a chat."""

    name: str
    every_s: float
    prompt: str
    reply_platform: str
    reply_chat_id: str


@dataclass
class CronTransport:
    gateway: Gateway
    jobs: Sequence[CronJob]
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    on_error: Callable[[CronJob, Exception], None] | None = None

    def start(self) -> None:
        for job in self.jobs:
            thread = threading.Thread(target=self._run, args=(job,), name=f"cron-{job.name}")
            thread.daemon = True
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def fire(self, job: CronJob, run: int) -> str:
        source = pb.Source(transport="cron", conversation_id=job.name)
        inbound = Inbound(
            source,
            job.prompt,
            # Unique per firing across restarts: the reply's ledger id derives from it.
            message_ref=f"cron:{job.name}:{time.time_ns()}:{run}",
            reply_platform=job.reply_platform,
            reply_chat_id=job.reply_chat_id,
        )
        return self.gateway.handle(inbound)

    def _run(self, job: CronJob) -> None:
        run = 0
        while not self._stop.wait(job.every_s):
            run += 1
            try:
                self.fire(job, run)
            except Exception as error:  # one failed run must not end the schedule
                if self.on_error is not None:
                    self.on_error(job, error)
