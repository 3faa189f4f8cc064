"""WatchEvents as a fan-out: one log tailer per process, a bounded queue per watcher.

The tailer reads each new event once (by sequence, in pages bounded by count and
bytes) and offers it to the watchers whose filter it matches, found through an index
by session and agent (no per-watcher query, no scan of every watcher per event). It
wakes on local commits at once, on Postgres on `LISTEN/NOTIFY` from other replicas,
and otherwise every `poll_s` (the fallback, which also recovers from database faults).

A new watcher first registers at the tailer's position H (so live events after H are
queued for it from then on), then catches up from the database in pages bounded by
bytes up to H, then drains its queue: no gap, no duplicate. A watcher whose
`after_sequence` is past H registers there instead, and is sent nothing until the log
passes it (it said it had seen everything up to it). While it catches up, a
queue that overflows is dropped and its catch-up target moved, so catching up never
fails. Once live, a watcher whose queue would pass its bound (events or bytes) is
ended ABORTED with reason WATCHER_TOO_SLOW and `resume_after_sequence` in its ErrorInfo
metadata: the last sequence it was sent, to pass as `after_sequence` to resume. Its
queue is released at once, so memory per watcher stays bounded whatever the event size
(a watcher that never reads holds at most the one message gRPC is sending).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from session_service import convert
from session_service.records import Event
from session_service.storage.event_log import LOG_CHANNEL
from session_service.storage.kinds import REWOUND
from session_service.storage.store import SessionStore
from switchboard.errors import Aborted, DomainError, ResourceExhausted
from switchboard.runner import TransactionRunner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WatchLimits:
    #: WatchEvents streams held at once by this process (--max-watchers).
    max_watchers: int = 4000
    #: A live watcher's queue holds at most this many events and bytes (but always one).
    queue_events: int = 1000
    queue_bytes: int = 4 * 1024 * 1024
    #: One database read (tailer or catch-up) returns at most this many events and bytes
    #: (but always one).
    page_events: int = 500
    page_bytes: int = 4 * 1024 * 1024
    #: Seconds between the tailer's looks for events no notification announced.
    poll_s: float = 1.0


@dataclass(eq=False)
class _Watcher:
    agent: str
    session_id: str
    #: Live events after this sequence are queued; the catch-up covers those up to it.
    live_after: int
    limits: WatchLimits
    queue: deque[tuple[Event, int]] = field(default_factory=deque)
    queued_bytes: int = 0
    catching_up: bool = True
    #: The last sequence handed to the caller (the resume point).
    sent: int = 0
    too_slow: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def wants(self, event: Event, kind: str | None) -> bool:
        if kind == REWOUND:
            return True  # a rewind concerns every watcher, as in the stored reads
        return (not self.agent or event.agent == self.agent) and (
            not self.session_id or event.session_id == self.session_id
        )

    def offer(self, event: Event, size: int) -> None:
        if event.sequence <= self.live_after or self.too_slow:
            return
        limits = self.limits
        full = len(self.queue) >= limits.queue_events or (
            self.queued_bytes + size > limits.queue_bytes
        )
        if full and self.queue:
            self._drop_queue()
            if self.catching_up:
                self.live_after = event.sequence  # the catch-up reads this one too
            else:
                self.too_slow = True
                self.wake.set()
            return
        self.queue.append((event, size))
        self.queued_bytes += size
        self.wake.set()

    def pop(self) -> Event:
        event, size = self.queue.popleft()
        self.queued_bytes -= size
        return event

    def _drop_queue(self) -> None:
        self.queue.clear()
        self.queued_bytes = 0


class Watching:
    """The process's watchers and its one tailer of the log."""

    def __init__(
        self,
        runner: TransactionRunner,
        store: SessionStore,
        limits: WatchLimits,
        watchable: Callable[[str, str], None],
    ) -> None:
        self.runner = runner
        self.store = store
        self.limits = limits
        #: Raises NotFound for a session the caller cannot see (run on the runner).
        self.watchable = watchable
        self._watchers: set[_Watcher] = set()
        self._everyone: set[_Watcher] = set()
        self._by_agent: dict[str, set[_Watcher]] = {}
        self._by_session: dict[str, set[_Watcher]] = {}
        #: The sequence up to which the tailer has offered events; None while stopped.
        self._head: int | None = None
        self._tailer: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()
        self._wake: asyncio.Event | None = None
        self._listening: Callable[[], None] | None = None

    # -- waking the tailer ------------------------------------------------------------------

    def notify(self) -> None:
        """Something was committed (by this process): the tailer reads at once."""
        if self._wake is not None:
            self._wake.set()

    def close(self) -> None:
        if self._listening is not None:
            self._listening()
            self._listening = None

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """On Postgres, commits of other replicas wake the tailer through NOTIFY."""
        if self._listening is not None:
            return

        def announced() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(self.notify)

        self._listening = self.store.backend.listen(LOG_CHANNEL, announced)

    # -- watching ---------------------------------------------------------------------------

    async def watch(self, after: int, agent: str, session_id: str) -> AsyncIterator[Event]:
        """Events after `after`, then live ones as they commit, until the caller leaves."""
        if session_id:
            # A session the caller cannot see is NOT_FOUND at once, as on every other
            # call (another agent's session too), rather than a silent stream.
            await self.runner.read(lambda: self.watchable(agent, session_id))
        watcher = await self._subscribe(after, agent, session_id)
        watcher.sent = after
        try:
            async for event in self._caught_up(watcher):
                yield event
            watcher.catching_up = False
            while True:
                while watcher.queue:
                    event = watcher.pop()
                    watcher.sent = event.sequence
                    yield event
                if watcher.too_slow:
                    raise _too_slow(watcher.sent)
                watcher.wake.clear()
                await watcher.wake.wait()
        finally:
            self._unsubscribe(watcher)

    async def _caught_up(self, watcher: _Watcher) -> AsyncIterator[Event]:
        """The stored events after `watcher.sent` up to its live point, page by page."""
        limits = self.limits
        while watcher.sent < watcher.live_after:
            until = watcher.live_after
            read = partial(
                self.store.log.read_page, watcher.sent, until, limits.page_events,
                limits.page_bytes, watcher.agent, watcher.session_id,
            )  # fmt: skip
            page, more = await self.runner.read(read)
            for event in page:
                watcher.sent = event.sequence
                yield event
            if not more:
                watcher.sent = max(watcher.sent, until)

    async def _subscribe(self, after: int, agent: str, session_id: str) -> _Watcher:
        if len(self._watchers) >= self.limits.max_watchers:
            raise ResourceExhausted(
                "TOO_MANY_WATCHERS",
                f"this server holds {len(self._watchers)} WatchEvents streams, its "
                "--max-watchers; retry later or on another replica",
                {"max_watchers": str(self.limits.max_watchers)},
            )
        head = await self._started()
        # A caller past the head (it saw those events through another replica, or asks
        # for the future) has seen everything up to `after`: it waits for what follows.
        watcher = _Watcher(agent, session_id, max(head, after), self.limits)
        self._watchers.add(watcher)
        for index in self._indexes_of(watcher):
            index.add(watcher)
        return watcher

    def _unsubscribe(self, watcher: _Watcher) -> None:
        self._watchers.discard(watcher)
        for index in self._indexes_of(watcher):
            index.discard(watcher)
        for key, table in ((watcher.session_id, self._by_session), (watcher.agent, self._by_agent)):
            if key in table and not table[key]:
                del table[key]
        watcher.queue.clear()

    def _indexes_of(self, watcher: _Watcher) -> list[set[_Watcher]]:
        if watcher.session_id:
            return [self._by_session.setdefault(watcher.session_id, set())]
        if watcher.agent:
            return [self._by_agent.setdefault(watcher.agent, set())]
        return [self._everyone]

    # -- the tailer -------------------------------------------------------------------------

    async def _started(self) -> int:
        """The tailer's position, starting it (at the log head) if it is stopped."""
        async with self._starting:
            if self._head is None:
                loop = asyncio.get_running_loop()
                self._wake = asyncio.Event()
                self._head = await self.runner.read(self.store.log.head)
                self._listen(loop)
                # In a context of its own: the tailer serves every watcher, so it must not
                # carry the first caller's deadline (`CALL_DEADLINE`), principal or request
                # id; with that deadline, every read after it passed would fail.
                self._tailer = loop.create_task(self._tail(), context=contextvars.Context())
            return self._head

    async def _tail(self) -> None:
        assert self._wake is not None
        wake = self._wake
        try:
            while self._watchers:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.limits.poll_s)
                wake.clear()
                await self._read_new()
        except RuntimeError:
            log.debug("the runner closed: the tailer stops")
        finally:
            self._head = None

    async def _read_new(self) -> None:
        """Offers every event after the head to its watchers, page by page."""
        limits = self.limits
        more = True
        while more and self._watchers:
            assert self._head is not None
            read = partial(
                self.store.log.read_page, self._head, None, limits.page_events, limits.page_bytes
            )
            try:
                page, more = await self.runner.read(read)
            except DomainError as exc:  # the database is away: the next poll retries
                log.warning("watching: reading the log failed (%s); retrying", exc.reason)
                return
            for event in page:
                self._offer(event)
                self._head = event.sequence

    def _offer(self, event: Event) -> None:
        kind = event.body.kind
        wanting = [w for w in self._candidates(event, kind) if w.wants(event, kind)]
        if not wanting:
            return  # sized only when someone takes it: the size costs an encoding
        size = convert.encoded_size(event)
        for watcher in wanting:
            watcher.offer(event, size)

    def _candidates(self, event: Event, kind: str | None) -> Iterable[_Watcher]:
        if kind == REWOUND:
            return list(self._watchers)
        found = list(self._everyone)
        found.extend(self._by_agent.get(event.agent, ()))
        if event.session_id:
            found.extend(self._by_session.get(event.session_id, ()))
        return found


def _too_slow(sent: int) -> Aborted:
    return Aborted(
        "WATCHER_TOO_SLOW",
        "this watcher fell behind the events it asked for and was ended to bound the "
        f"server's memory; watch again with after_sequence={sent} to resume",
        {"resume_after_sequence": str(sent)},
    )
