"""Two transports in the box: a terminal REPL and a cron-style scheduler.

Both are routed like any other transport: the REPL by its conversation id
(`agent:<agent>:repl:id=<id>`), each cron job by its name (`agent:<agent>:cron:id=<job>`).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
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


REPL_HELP = """commands (handled here, never sent to the agent):
  /help   this list
  /new    end this conversation's session and start a fresh one (asks first;
          /new! does not ask)
  /quit   leave (so does Ctrl-D)
anything else is sent to the agent."""

PROMPT = "you> "


def run_repl(
    gateway: Gateway,
    lines: Iterable[str],
    conversation_id: str = "default",
    *,
    out: TextIO | None = None,
    interactive: bool = False,
    on_error: Callable[[Exception], None] | None = None,
) -> None:
    """Feeds lines to the agent until "/quit" or the end of `lines`.

    "/help", "/new" and "/quit" are handled here and never reach the agent.
    `interactive` (a person at a terminal): a prompt before each line, and "/new"
    asks before it ends the session (piped input is a script that said so already).
    `on_error` gets a failed turn's error and the REPL goes on; without it the
    error propagates.
    """
    source = pb.Source(transport="repl", conversation_id=conversation_id)
    # Unique per run: a line of a later run is another inbound message, even when it
    # repeats the text and line number of an earlier run's (the reply's ledger id
    # derives from the message ref).
    run = uuid.uuid4().hex[:12]
    typed = _Terminal(iter(lines), out if interactive else None)
    number = 0
    while (line := typed.read(PROMPT)) is not None:
        number += 1
        text = line.strip()
        if not text:
            continue
        if text == "/quit":
            return
        if text == "/help":
            _say(out, REPL_HELP)
            continue
        if text in ("/new", "/new!"):
            if text == "/new" and interactive and not typed.confirm(CONFIRM_NEW):
                _say(out, "kept the current session")
                continue
            _new_session(gateway, conversation_id)
            _say(out, "started a new session")
            continue
        try:
            gateway.handle(Inbound(source, text, message_ref=f"repl-{run}-{number}"))
        except Exception as error:
            if on_error is None:
                raise
            on_error(error)


CONFIRM_NEW = "end this session and start a new one? [y/N] "


@dataclass
class _Terminal:
    """Lines typed by a person (`prompts` set: each asked for) or read from a script."""

    lines: Iterator[str]
    prompts: TextIO | None

    def read(self, prompt: str) -> str | None:
        if self.prompts is not None:
            print(prompt, end="", file=self.prompts, flush=True)
        line = next(self.lines, None)
        if line is None and self.prompts is not None:
            print(file=self.prompts, flush=True)  # Ctrl-D: the shell's prompt on a new line
        return line

    def confirm(self, question: str) -> bool:
        answer = self.read(question)
        return answer is not None and answer.strip().lower() in ("y", "yes")


def _new_session(gateway: Gateway, conversation_id: str) -> None:
    session = gateway.sessions.resolve(
        gateway.agent, transport="repl", conversation_id=conversation_id
    ).session
    gateway.sessions.reset(gateway.agent, session.session_id, "/new")


def _say(out: TextIO | None, text: str) -> None:
    if out is not None:
        print(text, file=out, flush=True)


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
