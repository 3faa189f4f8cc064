"""The live tail: ONE WatchEvents stream per console process, fanned out to every
browser that follows the timeline.

A browser costs the services nothing: it gets the events from memory. The stream
runs while at least one browser follows, with the token of one of the (admin)
logins following; when that browser leaves, the stream continues from the last
event it delivered with another follower's token. A short ring of recent events
lets a browser that reconnects (its Last-Event-ID) or subscribes just after its page
was read catch up without a read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from switchboard_client._base import bearer

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_console.view_models import event_summary

log = logging.getLogger(__name__)

#: Recent events kept for late subscribers and reconnects.
RING_EVENTS = 2000
#: Events a browser may lag behind before it is told to reload.
QUEUE_EVENTS = 1000
#: Pause before the stream is opened again after the service went away.
RETRY_PAUSE_S = 1.0


@dataclass(eq=False)
class Follower:
    token: str
    queue: asyncio.Queue[dict[str, Any] | None] = field(
        default_factory=lambda: asyncio.Queue(QUEUE_EVENTS)
    )
    number: int = 0


class LiveHub:
    def __init__(self, channel: Callable[[], grpc.aio.Channel]) -> None:
        self._channel = channel
        self._followers: dict[int, Follower] = {}
        self._numbers = itertools.count(1)
        self._ring: deque[dict[str, Any]] = deque(maxlen=RING_EVENTS)
        self._last_sequence = 0
        self._task: asyncio.Task[None] | None = None
        self._streaming_for: Follower | None = None
        #: Streams opened so far (the benchmark checks it stays one for N browsers).
        self.streams_opened = 0

    @property
    def follower_count(self) -> int:
        return len(self._followers)

    def follow(self, token: str, after_sequence: int) -> Follower:
        """A new follower, caught up from the ring on events after `after_sequence`
        (the head its page was read at, or its Last-Event-ID)."""
        follower = Follower(token=token, number=next(self._numbers))
        for summary in self._ring:
            if summary["seq"] > after_sequence:
                follower.queue.put_nowait(summary)
        if not self._last_sequence:
            self._last_sequence = after_sequence
        self._followers[follower.number] = follower
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="console-live-tail")
        return follower

    def leave(self, follower: Follower) -> None:
        self._followers.pop(follower.number, None)
        if self._streaming_for is follower and self._task is not None:
            self._task.cancel()  # restarted below with another follower's token
            self._task = None
            self._streaming_for = None
        if self._followers and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run(), name="console-live-tail")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for follower in self._followers.values():
            with contextlib.suppress(asyncio.QueueFull):
                follower.queue.put_nowait(None)

    async def _run(self) -> None:
        while self._followers:
            follower = next(iter(self._followers.values()))
            self._streaming_for = follower
            try:
                await self._stream(follower.token)
                code = None  # the service ended the stream (draining): watch again
            except grpc.aio.AioRpcError as error:
                code = error.code()
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                self._end(follower)  # this login's token cannot watch (revoked): it leaves
            elif code != grpc.StatusCode.ABORTED:  # ABORTED: it fell behind; resume at once
                log.warning("live tail: the watch ended (%s); watching again", code)
                await asyncio.sleep(RETRY_PAUSE_S)
        self._streaming_for = None

    async def _stream(self, token: str) -> None:
        stub = pb_grpc.SessionServiceStub(self._channel())
        request = pb.WatchEventsRequest(after_sequence=self._last_sequence)
        self.streams_opened += 1
        call = stub.WatchEvents(request, metadata=bearer(token))
        async for answer in call:
            self._deliver(event_summary(answer.event, abandoned=False))

    def _deliver(self, summary: dict[str, Any]) -> None:
        self._last_sequence = max(self._last_sequence, summary["seq"])
        self._ring.append(summary)
        for follower in list(self._followers.values()):
            try:
                follower.queue.put_nowait(summary)
            except asyncio.QueueFull:
                self._end(follower)  # too far behind: its page reloads

    def _end(self, follower: Follower) -> None:
        self._followers.pop(follower.number, None)
        with contextlib.suppress(asyncio.QueueFull):
            follower.queue.put_nowait(None)
        follower.queue = asyncio.Queue(1)
        follower.queue.put_nowait(None)
