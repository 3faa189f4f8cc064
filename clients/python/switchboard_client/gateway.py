"""The reference gateway, threaded: chat platforms ↔ an agent, with the delivery ledger.

`Gateway` drives the rules of `switchboard_client._core` (the data flow of a
turn, Hermes' boot order, claims, the recovered-reply marker, resume and
holder liveness; read its docstring) with the blocking `SessionClient` and
`DeliveryClient`, sync platform adapters and an agent callable. Heartbeats and
periodic claims run on daemon threads; `handle` may be called from any thread.
`AsyncGateway` (switchboard_client.async_gateway) drives the same rules on
asyncio. The adapter contract is `switchboard_client.adapters`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from switchboard_client._core import (
    RECOVERED_MARKER,
    STEP_DRAIN_S,
    Call,
    GatewayRules,
    GatewayView,
    Inbound,
    Steps,
    T,
    Turn,
    drive,
    log,
)
from switchboard_client.adapters import PlatformAdapter, SendFailed
from switchboard_client.delivery import DeliveryClient
from switchboard_client.reply_targets import reply_sealer
from switchboard_client.session import SessionClient

AgentCallback = Callable[[Turn], str]


class Gateway(GatewayView):
    def __init__(
        self,
        name: str,
        agent: str,
        sessions: SessionClient,
        ledger: DeliveryClient,
        adapters: Sequence[PlatformAdapter],
        callback: AgentCallback,
        *,
        heartbeat_s: float = 10.0,
        claim_every_s: float = 15.0,
        history_window: int = 50,
        reply_key: str | bytes | None = None,
    ) -> None:
        """`name` names the bot account (only its instances claim its replies);
        `agent` the agent every turn runs as. `reply_key` (else SWITCHBOARD_REPLY_KEY)
        seals reply targets (`switchboard_client.reply_targets`); a short or
        placeholder key raises `ReplyKeyRefused` here, and `start` refuses an agent
        that redacts PII without one."""
        self.rules = GatewayRules(name, agent, adapters, history_window, reply_sealer(reply_key))
        self.sessions = sessions
        self.ledger = ledger
        self.callback = callback
        self.heartbeat_s = heartbeat_s
        self.claim_every_s = claim_every_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # One resume pass at a time: the periodic one and a caller's never run a turn twice.
        self._resuming = threading.Lock()

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        """Hermes' boot order: register, recover owed replies, then resume turns."""
        self._run(self.rules.boot())

    def stop(self) -> None:
        """Graceful stop: periodic steps under way finish (see `STEP_DRAIN_S`), then this
        instance's unfinished rows become claimable at once."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=STEP_DRAIN_S)
        self._run(self.rules.stop())

    def reconnected(self, platform: str) -> None:
        """A platform came back: say so at once and deliver what waited for it."""
        self._run(self.rules.reconnected(platform))

    # -- turns and recovery ----------------------------------------------------------------

    def handle(self, inbound: Inbound) -> str:
        """One turn for an inbound message; returns the reply that was sent ("" for
        a message the session had already: one platform message is one turn)."""
        return self._run(self.rules.handle(inbound))

    def resume_interrupted(self) -> None:
        """Re-runs the turns a crash cut off, if still fresh (stale ones are reset).
        A turn whose holder is another, live instance is left to it and deferred."""
        with self._resuming:
            self._run(self.rules.resume_pass(only_deferred=False))

    def resume_deferred(self) -> None:
        """Looks again at deferred turns: resumes those whose holder has died since."""
        with self._resuming:
            self._run(self.rules.resume_pass(only_deferred=True))

    def recover(self, platforms: Sequence[str] | None = None) -> int:
        """Claims what is owed (dead instances' rows, due retries) and redelivers it."""
        return self._run(self.rules.recover(platforms))

    def deliver(
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
        return self._run(steps)

    # -- the driver ------------------------------------------------------------------------

    def _run(self, steps: Steps[T]) -> T:
        return drive(steps, self._perform)

    def _perform(self, call: Call) -> Any:
        if call.target == "driver":
            return getattr(self, f"_{call.method}")()
        if call.target == "agent":
            return self.callback(*call.args)
        if call.target == "platform":
            target: Any = self.rules.adapters[call.platform]
        else:
            target = self.sessions if call.target == "sessions" else self.ledger
        answer = getattr(target, call.method)(*call.args, **call.kwargs)
        return list(answer) if call.collect else answer

    def _resume_interrupted(self) -> None:
        self.resume_interrupted()

    def _resume_deferred(self) -> None:
        self.resume_deferred()

    def _start_heartbeats(self) -> None:
        self._spawn(self._heartbeats, "heartbeat")

    def _start_periodic_claims(self) -> None:
        self._spawn(self._periodic_claims, "claims")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"gateway-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _heartbeats(self) -> None:
        self._every(lambda: self.heartbeat_s, self.rules.heartbeat, "heartbeat")

    def _periodic_claims(self) -> None:
        self._every(lambda: self.claim_every_s, self.rules.periodic_claim, "claims")

    def _every(
        self, period_s: Callable[[], float], rule: Callable[[], Steps[None]], name: str
    ) -> None:
        # The period is read each time: a caller may change it on a running gateway.
        while not self._stop.wait(period_s()):
            try:
                self._run(rule())
            except Exception:  # the rules log the expected failures; keep going
                log.exception("gateway %s: the %s step failed", self.name, name)


__all__ = [
    "RECOVERED_MARKER",
    "AgentCallback",
    "Gateway",
    "Inbound",
    "PlatformAdapter",
    "SendFailed",
    "Turn",
]
