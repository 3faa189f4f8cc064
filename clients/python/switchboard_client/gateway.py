"""A reference gateway runtime: chat platforms ↔ an agent, with the delivery ledger.

The data flow of one turn:
    inbound message → ResolveSession → inbox (+ resume mark) → the agent callback
    → RecordObligation (straight into ATTEMPTING) → platform send
    → MarkDelivered / MarkFailed → history, resume mark cleared.
The ledger never blocks a send: if the DeliveryService is unreachable, the reply
still goes out (unrecorded) and the failure is logged.

Boot order (Hermes'): register the instance with the platforms connected now
and start heartbeats → claim and redeliver what dead instances owed (with the
recovered-reply marker where the first send may have gone out) → only then
resume interrupted turns that are still fresh, so a turn whose answer is
already owed is redelivered, not re-run. While running, a periodic claim picks
up retries and orphans; reconnecting a platform claims for it at once.

A resume mark names its holder (the instance running the turn). A booting
gateway leaves a turn alone while its holder is live (another replica waiting
for the model, say) and looks at it again with each periodic claim: once the
holder's lease has run out without the mark being cleared, the turn is resumed.

Beyond the honest marker, a platform adapter may avoid the duplicate itself:
`idempotent_sends` (the obligation id is passed as the platform's idempotency
key, e.g. Discord's nonce, LINE's X-Line-Retry-Key) or `was_delivered(key)`.
A recovered reply then goes out once, without the marker.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.delivery import DeliveryClient
from switchboard_client.errors import SwitchboardError
from switchboard_client.session import SessionClient

log = logging.getLogger("switchboard_client.gateway")

RECOVERED_MARKER = "[recovered reply: you may have seen this message already]\n"


class SendFailed(Exception):
    """A platform refused a send. `retryable` tells the ledger whether to try again."""

    def __init__(
        self, message: str, retryable: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class PlatformAdapter(Protocol):
    """What a chat platform offers the gateway."""

    #: The platform's name ("slack", "telegram", ...), as in routing keys.
    name: str
    #: The platform drops a second send carrying the same idempotency key.
    idempotent_sends: bool

    def connect(self) -> None: ...

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        """Sends; returns the platform's message id. Raises SendFailed."""
        ...

    def was_delivered(self, idempotency_key: str) -> str | None:
        """The platform message id if a send with this key arrived, None if not or unknown."""
        ...


@dataclass(frozen=True)
class Inbound:
    """A message a platform (or another transport) handed to the gateway."""

    source: pb.Source
    text: str
    #: The platform's id for the inbound message (part of the reply's ledger id).
    message_ref: str = ""
    #: Where the reply goes: a platform adapter's name and chat (defaults: the source's).
    reply_platform: str = ""
    reply_chat_id: str = ""


@dataclass(frozen=True)
class Turn:
    """What the agent callback sees."""

    session: pb.Session
    state: pb.GetSessionStateResponse
    history: Sequence[pb.QueuedMessage]
    inbound: Inbound | None  # None when an interrupted turn is resumed


AgentCallback = Callable[[Turn], str]


class Gateway:
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
    ) -> None:
        self.name = name
        self.agent = agent
        self.sessions = sessions
        self.ledger = ledger
        self.adapters = {adapter.name: adapter for adapter in adapters}
        self.callback = callback
        self.heartbeat_s = heartbeat_s
        self.claim_every_s = claim_every_s
        self.history_window = history_window
        self.instance_id = ""
        self.connected: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Sessions whose turn a live instance was running when we looked.
        self.deferred: set[str] = set()
        # One resume pass at a time: the periodic one and a caller's never run a turn twice.
        self._resuming = threading.Lock()

    # -- life ------------------------------------------------------------------------------

    def start(self) -> None:
        """Hermes' boot order: register, recover owed replies, then resume turns."""
        for adapter in self.adapters.values():
            try:
                adapter.connect()
                self.connected.add(adapter.name)
            except Exception:
                log.exception("platform %s did not connect", adapter.name)
        instance = self.ledger.register(
            self.name, sorted(self.connected), host=socket.gethostname(), pid=os.getpid()
        )
        self.instance_id = instance.instance_id
        self._spawn(self._heartbeats, "heartbeat")
        self.recover()
        self.resume_interrupted()
        self._spawn(self._periodic_claims, "claims")

    def stop(self) -> None:
        """Graceful stop: this instance's unfinished rows become claimable at once."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self.instance_id:
            try:
                self.ledger.deregister(self.instance_id)
            except SwitchboardError:
                log.warning("deregistering %s failed", self.instance_id)

    def reconnected(self, platform: str) -> None:
        """A platform came back: say so at once and deliver what waited for it."""
        self.connected.add(platform)
        self.ledger.heartbeat(self.instance_id, sorted(self.connected))
        self.recover([platform])

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=f"gateway-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.ledger.heartbeat(self.instance_id, sorted(self.connected))
            except SwitchboardError:
                log.warning("heartbeat failed; retrying in %.0f s", self.heartbeat_s)

    def _periodic_claims(self) -> None:
        while not self._stop.wait(self.claim_every_s):
            try:
                self.recover()
                self.resume_deferred()
            except SwitchboardError:
                log.warning("periodic claim failed")

    # -- turns -----------------------------------------------------------------------------

    def handle(self, inbound: Inbound) -> str:
        """One turn for an inbound message; returns the reply that was sent."""
        source = inbound.source
        session = self.sessions.resolve(
            self.agent,
            transport=source.transport,
            conversation_id=source.conversation_id,
            chat_type=source.chat_type,
            chat_id=source.chat_id,
            thread_id=source.thread_id,
            user_id=source.user_id,
            scope_id=source.scope_id,
        ).session
        message = pb.Message(
            role=pb.ROLE_USER,
            content=inbound.text,
            sender=source.user_id,
            message_ref=inbound.message_ref,
        )
        # Mark first: a crash after the mark and before the post leaves a mark with
        # nothing to answer (cleared at the next boot), never a stored, unmarked message.
        # The mark names this instance, so that a gateway booting meanwhile leaves the
        # turn to us while we are alive.
        self.sessions.mark_resumable(self.agent, session.session_id, True, holder=self.instance_id)
        self.sessions.post_to_inbox(self.agent, session.session_id, message)
        return self._run_turn(session, inbound)

    def resume_interrupted(self) -> None:
        """Re-runs the turns a crash cut off, if still fresh (stale ones are reset).

        A turn whose holder is another, live instance is left to it and deferred.
        """
        self._resume_pass(lambda session: True)

    def resume_deferred(self) -> None:
        """Looks again at deferred turns: resumes those whose holder has died since."""
        if self.deferred:
            self._resume_pass(lambda session: session.session_id in self.deferred)

    def _resume_pass(self, wanted: Callable[[pb.Session], bool]) -> None:
        with self._resuming:
            # Stale turns are reset, not continued: their users start afresh.
            self.sessions.expire_resumable(self.agent)
            resumable = self.sessions.list_resumable(self.agent).sessions
            # A deferred turn no longer listed was finished (or reset): forget it.
            self.deferred &= {session.session_id for session in resumable}
            for session in resumable:
                if session.suspended or not wanted(session):
                    continue
                holder = session.resume_holder
                if holder and holder == self.instance_id:
                    continue  # running in this process (a turn that failed here: next boot)
                if holder and self._is_live(holder):
                    self.deferred.add(session.session_id)
                    continue
                self.deferred.discard(session.session_id)
                self._resume_safely(session)

    def _is_live(self, instance_id: str) -> bool:
        """Whether the instance holding a mark still runs (an empty holder is unknown:
        the caller resumes as before holders existed)."""
        try:
            return self.ledger.instance(instance_id).live
        except SwitchboardError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return False  # registered with another ledger, or pruned: nobody runs it
            # Unsure: leave the turn alone now and look again at the next periodic claim.
            log.warning("could not tell whether %s is live: %s", instance_id, error)
            return True

    def _resume_safely(self, session: pb.Session) -> None:
        """One session's failure (the agent or a platform raising) must not cost the
        others their resume, nor the gateway its start; the mark stays, so a later
        boot retries it while it is fresh."""
        try:
            self._resume(session)
        except Exception:
            log.exception("resuming session %s failed; its mark stays", session.session_id)

    def _resume(self, session: pb.Session) -> None:
        """Answers only what no reply covers yet: an owed reply is redelivered by a
        claim, a delivered one only completes its turn; neither is re-run."""
        key = session.routing_key or session.session_id
        rows = [
            row
            for row in self.ledger.list(session_key=key)
            if row.metadata.get("session_id") == session.session_id
        ]
        owed = (
            dpb.OBLIGATION_STATE_PENDING,
            dpb.OBLIGATION_STATE_ATTEMPTING,
            dpb.OBLIGATION_STATE_FAILED,
        )
        if any(row.state in owed for row in rows):
            return
        delivered = [row for row in rows if row.state == dpb.OBLIGATION_STATE_DELIVERED]
        latest = max(
            delivered, key=lambda row: int(row.metadata.get("inbox_through", "0")), default=None
        )
        answered_through = int(latest.metadata.get("inbox_through", "0")) if latest else 0
        inbox = list(self.sessions.state(self.agent, session.session_id).state.inbox)
        if any(q.sequence > answered_through for q in inbox):
            log.info("resuming interrupted session %s", session.session_id)
            # Take the turn over, so that a gateway booting meanwhile leaves it to us
            # (the mark keeps its time: the freshness window still counts from the crash).
            self.sessions.mark_resumable(
                self.agent, session.session_id, True, holder=self.instance_id
            )
            self._run_turn(session, None)
        elif latest is not None and inbox:
            self._finish_turn(session.session_id, latest.content, inbox, answered_through)
        else:
            self.sessions.mark_resumable(self.agent, session.session_id, False)

    def _run_turn(self, session: pb.Session, inbound: Inbound | None) -> str:
        state = self.sessions.state(self.agent, session.session_id)
        history = self.sessions.history(
            self.agent, session.session_id, limit=self.history_window, newest=True
        )
        reply = self.callback(Turn(session, state, history, inbound))
        inbox_through = state.state.inbox[-1].sequence if state.state.inbox else 0
        platform, chat_id, thread_id = self._reply_target(session, inbound)
        message_ref = inbound.message_ref if inbound else f"resume:{session.last_sequence}"
        # Where the reply belongs, so that a gateway recovering it can finish the turn.
        turn = {
            "agent": self.agent,
            "session_id": session.session_id,
            "inbox_through": str(inbox_through),
        }
        ours = self.deliver(
            session.routing_key or session.session_id,
            message_ref,
            reply,
            platform,
            chat_id,
            thread_id,
            metadata=turn,
        )
        if ours:  # else the instance that owes it finishes the turn when it delivers
            self._finish_turn(session.session_id, reply, list(state.state.inbox), inbox_through)
        return reply

    def _finish_turn(
        self,
        session_id: str,
        reply: str,
        inbox: Sequence[pb.QueuedMessage],
        inbox_through: int,
    ) -> None:
        """Moves the turn's inbox into the history with the reply; clears the resume mark."""
        events = [
            pb.SessionEventInput(
                message_appended=pb.MessageAppended(
                    message=pb.Message(
                        role=pb.ROLE_USER, content=q.message.content, sender=q.message.sender
                    )
                )
            )
            for q in inbox
        ]
        events.append(
            pb.SessionEventInput(
                message_appended=pb.MessageAppended(
                    message=pb.Message(role=pb.ROLE_ASSISTANT, content=reply)
                )
            )
        )
        if inbox_through:
            events.append(
                pb.SessionEventInput(inbox_drained=pb.InboxDrained(through_sequence=inbox_through))
            )
        self.sessions.append(self.agent, session_id, *events)
        self.sessions.mark_resumable(self.agent, session_id, False)

    def _reply_target(self, session: pb.Session, inbound: Inbound | None) -> tuple[str, str, str]:
        source = inbound.source if inbound else session.source
        platform = (inbound.reply_platform if inbound else "") or source.transport
        chat_id = (inbound.reply_chat_id if inbound else "") or source.chat_id
        return platform, chat_id or source.conversation_id, source.thread_id

    # -- delivery --------------------------------------------------------------------------

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
        """Records the reply as owed, then sends it; the ledger never blocks the send.

        False when this very reply was recorded before by another instance: it is
        delivered already, or owed by that instance and redelivered by a claim.
        """
        adapter = self.adapters[platform]
        recorded = self.ledger.record_best_effort(
            self.instance_id,
            session_key=session_key,
            message_ref=message_ref,
            content=content,
            platform=platform,
            chat_id=chat_id,
            thread_id=thread_id,
            metadata=metadata or {},
            begin_attempt=True,
        )
        row = recorded.obligation if recorded is not None else None
        if row is not None and row.owner_instance_id != self.instance_id:
            log.info(
                "reply %s is recorded already (%s); not sending it again",
                row.id,
                dpb.ObligationState.Name(row.state),
            )
            return False
        self._send(adapter, row, chat_id, thread_id, content, key=row.id if row else "")
        return True

    def recover(self, platforms: Sequence[str] | None = None) -> int:
        """Claims what is owed (dead instances' rows, due retries) and redelivers it."""
        claimed = self.ledger.claim_recoverable(
            self.instance_id, deliverable_platforms=platforms
        ).obligations
        for row in claimed:
            adapter = self.adapters.get(row.platform)
            if adapter is None:
                continue
            if not adapter.idempotent_sends:
                already = adapter.was_delivered(row.id)
                if already is not None:
                    self.ledger.mark_delivered(self.instance_id, row, already)
                    self._finish_recovered_turn(row)
                    continue
            marker = row.needs_marker and not adapter.idempotent_sends
            text = RECOVERED_MARKER + row.content if marker else row.content
            if self._send(adapter, row, row.chat_id, row.thread_id, text, key=row.id):
                self._finish_recovered_turn(row)
        return len(claimed)

    def _finish_recovered_turn(self, row: dpb.Obligation) -> None:
        """A redelivered reply completes the turn it came from, so it is not re-run."""
        session_id = row.metadata.get("session_id", "")
        if row.metadata.get("agent") != self.agent or not session_id:
            return
        try:
            state = self.sessions.state(self.agent, session_id).state
            through = int(row.metadata.get("inbox_through", "0"))
            inbox = [q for q in state.inbox if q.sequence <= through]
            self._finish_turn(session_id, row.content, inbox, through)
        except SwitchboardError as error:
            log.warning("could not complete the recovered turn of %s: %s", session_id, error)

    def _send(
        self,
        adapter: PlatformAdapter,
        row: dpb.Obligation | None,
        chat_id: str,
        thread_id: str,
        text: str,
        key: str,
    ) -> bool:
        """Sends and records the outcome; True when the platform took the message."""
        try:
            platform_id = adapter.send(chat_id, thread_id, text, key)
        except SendFailed as failed:
            log.warning("send to %s failed: %s", adapter.name, failed)
            if row is not None:
                try:
                    self.ledger.mark_failed(
                        self.instance_id,
                        row,
                        str(failed),
                        retryable=failed.retryable,
                        retry_after_s=failed.retry_after_s,
                    )
                except SwitchboardError as error:
                    log.warning("ledger update failed: %s", error)
            return False
        if row is not None:
            try:
                self.ledger.mark_delivered(self.instance_id, row, platform_id)
            except SwitchboardError as error:
                log.warning("ledger update failed: %s", error)
        return True
