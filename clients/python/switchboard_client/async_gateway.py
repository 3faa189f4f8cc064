"""The reference gateway on asyncio: the same rules as `Gateway`, awaited.

`AsyncGateway` drives the rules of `switchboard_client._core` (one
implementation for both gateways: boot order, claims, heartbeats, the
recovered-reply marker, resume, holder liveness) with `AsyncSessionClient`
and `AsyncDeliveryClient` (grpc.aio). Heartbeats and periodic claims are
tasks of the running loop. Adapters and the agent callback may be async
(`async def`, as python-telegram-bot, slack_sdk's async client and discord.py
are) or blocking; blocking ones run in a worker thread (`asyncio.to_thread`),
so a slow model call or platform request never stalls the loop.

    async with AsyncSessionClient(addr1) as sessions, AsyncDeliveryClient(addr2) as ledger:
        gateway = AsyncGateway("my-bot", "main", sessions, ledger, [adapter], agent)
        await gateway.start()
        ...
        await gateway.handle(Inbound(source, text, message_ref=update_id))
        ...
        await gateway.stop()
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from switchboard_client._core import (
    STEP_DRAIN_S,
    Call,
    GatewayRules,
    GatewayView,
    Inbound,
    Steps,
    T,
    Turn,
    drive_async,
    log,
)
from switchboard_client.adapters import AsyncPlatformAdapter, PlatformAdapter
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.reply_targets import reply_sealer

AsyncAgentCallback = Callable[[Turn], Awaitable[str]] | Callable[[Turn], str]


class AsyncGateway(GatewayView):
    def __init__(
        self,
        name: str,
        agent: str,
        sessions: AsyncSessionClient,
        ledger: AsyncDeliveryClient,
        adapters: Sequence[AsyncPlatformAdapter | PlatformAdapter],
        callback: AsyncAgentCallback,
        *,
        heartbeat_s: float = 10.0,
        claim_every_s: float = 15.0,
        history_window: int = 50,
        reply_key: str | bytes | None = None,
    ) -> None:
        """As `Gateway`: `name` names the bot account, `agent` the agent of every turn,
        `reply_key` (else SWITCHBOARD_REPLY_KEY) seals reply targets."""
        self.rules = GatewayRules(name, agent, adapters, history_window, reply_sealer(reply_key))
        self.sessions = sessions
        self.ledger = ledger
        self.callback = callback
        self.heartbeat_s = heartbeat_s
        self.claim_every_s = claim_every_s
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        # One resume pass at a time: the periodic one and a caller's never run a turn twice.
        self._resuming = asyncio.Lock()

    # -- life ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Hermes' boot order: register, recover owed replies, then resume turns."""
        await self._run(self.rules.boot())

    async def stop(self) -> None:
        """Graceful stop: periodic steps under way finish (see `STEP_DRAIN_S`), then this
        instance's unfinished rows become claimable at once."""
        self._stopping.set()
        if self._tasks:
            _, late = await asyncio.wait(self._tasks, timeout=STEP_DRAIN_S)
            for task in late:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._stopping.clear()  # a gateway started again beats and claims again
        await self._run(self.rules.stop())

    async def reconnected(self, platform: str) -> None:
        """A platform came back: say so at once and deliver what waited for it."""
        await self._run(self.rules.reconnected(platform))

    # -- turns and recovery ----------------------------------------------------------------

    async def handle(self, inbound: Inbound) -> str:
        """One turn for an inbound message; returns the reply that was sent ("" for
        a message the session had already: one platform message is one turn)."""
        return await self._run(self.rules.handle(inbound))

    async def resume_interrupted(self) -> None:
        """Re-runs the turns a crash cut off, if still fresh (stale ones are reset).
        A turn whose holder is another, live instance is left to it and deferred."""
        async with self._resuming:
            await self._run(self.rules.resume_pass(only_deferred=False))

    async def resume_deferred(self) -> None:
        """Looks again at deferred turns: resumes those whose holder has died since."""
        async with self._resuming:
            await self._run(self.rules.resume_pass(only_deferred=True))

    async def recover(self, platforms: Sequence[str] | None = None) -> int:
        """Claims what is owed (dead instances' rows, due retries) and redelivers it."""
        return await self._run(self.rules.recover(platforms))

    async def deliver(
        self,
        session_key: str,
        message_ref: str,
        content: str,
        platform: str,
        chat_id: str,
        thread_id: str = "",
        metadata: dict[str, str] | None = None,
    ) -> bool:
        """Records a reply as owed, then sends it (False: another instance owes it)."""
        steps = self.rules.deliver(
            session_key, message_ref, content, platform, chat_id, thread_id, metadata
        )
        return await self._run(steps)

    # -- the driver ------------------------------------------------------------------------

    async def _run(self, steps: Steps[T]) -> T:
        return await drive_async(steps, self._perform)

    async def _perform(self, call: Call) -> Any:
        if call.target == "driver":
            return await getattr(self, f"_{call.method}")()
        if call.target == "agent":
            return await _call_either(self.callback, *call.args)
        if call.target == "platform":
            method = getattr(self.rules.adapters[call.platform], call.method)
            return await _call_either(method, *call.args)
        client: Any = self.sessions if call.target == "sessions" else self.ledger
        answer = getattr(client, call.method)(*call.args, **call.kwargs)
        if call.collect:
            return [item async for item in answer]
        return await answer

    async def _resume_interrupted(self) -> None:
        await self.resume_interrupted()

    async def _resume_deferred(self) -> None:
        await self.resume_deferred()

    async def _start_heartbeats(self) -> None:
        self._every(lambda: self.heartbeat_s, self.rules.heartbeat, "heartbeat")

    async def _start_periodic_claims(self) -> None:
        self._every(lambda: self.claim_every_s, self.rules.periodic_claim, "claims")

    def _every(
        self, period_s: Callable[[], float], rule: Callable[[], Steps[None]], name: str
    ) -> None:
        async def loop() -> None:
            # The period is read each time: a caller may change it on a running gateway.
            while not await self._stopped_within(period_s()):
                try:
                    await self._run(rule())
                except Exception:  # the rules log the expected failures; keep beating
                    log.exception("gateway %s: the %s step failed", self.name, name)

        self._tasks.append(asyncio.create_task(loop(), name=f"gateway-{name}"))

    async def _stopped_within(self, seconds: float) -> bool:
        """Waits `seconds` or until `stop()`; whether the gateway is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)
        return self._stopping.is_set()


async def _call_either(function: Callable[..., Any], *args: Any) -> Any:
    """Awaits an async callable; runs a blocking one in a worker thread."""
    if inspect.iscoroutinefunction(function):
        return await function(*args)
    answer = await asyncio.to_thread(function, *args)
    # A sync callable may still hand back an awaitable (a partial of an async def).
    return await answer if inspect.isawaitable(answer) else answer


__all__ = ["AsyncAgentCallback", "AsyncGateway", "Inbound", "Turn"]
