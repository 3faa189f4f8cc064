"""WatchEvents: the log as a live stream, resumable by sequence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from session_service.log_store import LogStore
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2 as pb


class Watching:
    def __init__(
        self,
        runner: TransactionRunner,
        store: LogStore,
        limits: Any,
        watchable: Callable[[str, str], None],
    ) -> None:
        self.runner = runner
        self.store = store
        self.limits = limits
        #: Raises NotFound for a session the caller cannot see.
        self.watchable = watchable
        self._waiters: set[asyncio.Future[None]] = set()
        self._head_poller: asyncio.Task[None] | None = None

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def watch(self, after: int, agent: str, session_id: str) -> AsyncIterator[pb.Event]:
        """Events after `after`, then live ones as they commit, until the caller leaves.

        An idle watcher is a parked coroutine: local commits wake it at once, and
        one shared poller of the log head (not one per watcher) wakes it for
        events other replicas appended.
        """
        if session_id:
            # A session the caller cannot see is NOT_FOUND at once, as on every other
            # call (another agent's session too), rather than a silent stream.
            await self.runner.read(lambda: self.watchable(agent, session_id))
        last = after
        while True:
            # Register before reading, so a commit between the read and the wait
            # is not missed.
            waiter = self._register_waiter()
            try:
                batch = await self.runner.read(
                    lambda last=last: self.store.read(last, 500, agent, session_id)  # type: ignore[misc]
                )
                for event in batch:
                    yield event
                    last = event.sequence
                if len(batch) < 500:
                    await waiter
            finally:
                self._waiters.discard(waiter)

    def _register_waiter(self) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.add(waiter)
        if self._head_poller is None or self._head_poller.done():
            self._head_poller = loop.create_task(self._poll_head())
        return waiter

    async def _poll_head(self) -> None:
        """While anyone watches, wakes them when the log head moves (other replicas)."""
        try:
            seen = await self.runner.read(self.store.head)
            while self._waiters:
                await asyncio.sleep(self.limits.watch_poll_s)
                head = await self.runner.read(self.store.head)
                if head != seen:
                    seen = head
                    self.notify()
        except RuntimeError:
            return  # the runner closed: the server is stopping
