"""The gateway's rules, once, for both drivers (sans-IO).

Every rule of the reference gateway (boot order, claims, heartbeats, the
recovered-reply marker, resume, holder liveness) is written here as a
generator of steps: it yields a `Call` for each piece of I/O (an RPC, a
platform call, the agent callback) and receives its answer, or has its
exception thrown in at the `yield`. A driver performs the calls: `Gateway`
(gateway.py) with blocking clients and threads, `AsyncGateway`
(async_gateway.py) with grpc.aio clients and tasks. Neither driver decides
anything, so the two cannot drift apart.

The data flow of one turn:
    inbound message → ResolveSession → inbox post with the resume mark (naming
    this instance) → the agent callback → RecordObligation (straight into ATTEMPTING)
    → platform send → MarkDelivered / MarkFailed → history, resume mark cleared.
The ledger never blocks a send: if the DeliveryService is unreachable, the reply
still goes out (unrecorded) and the failure is logged.

Boot order (Hermes'): connect the platforms, register the instance with those
connected and start heartbeats → claim and redeliver what dead instances owed
(with the marker where the first send may have gone out) → only then resume
interrupted turns that are still fresh, so a turn whose answer is already owed
is redelivered, not re-run → periodic claims. Reconnecting a platform claims
for it at once.

A resume mark names its holder (the instance running the turn). A booting
gateway leaves a turn alone while its holder is live and looks at it again
with each periodic claim: once the holder's lease has run out without the mark
being cleared, the turn is resumed.

Reply targets (`switchboard_client.reply_targets`). A gateway with a reply key
seals where a turn's reply goes (platform, chat, thread) onto the resume mark
and into the ledger row, whose chat_id and thread_id then stay empty: neither
service sees a raw id, and a gateway resuming the turn or redelivering the row
opens the target and answers the raw chat. A gateway without a key refuses to
boot for an agent that redacts PII (its resumed replies would have nowhere to
go). When a target cannot be opened (another key, altered, or a mark of an
older gateway on a session whose ids are hashed), nothing is sent to a hashed
id: a resumed turn is given up (logged, its mark cleared, the ledger untouched;
its messages stay in the inbox and are answered with the user's next message),
and a claimed row is left as claimed (logged, not marked), so that a gateway
holding the key redelivers it once this instance has stopped.

One platform message, one turn: a session accepts one inbox post per
message_ref, and a post the session accepted before comes back `duplicate`
(a platform's retry, or the update reaching two instances), having written
nothing, its resume mark included. Such a message's turn belongs to the
delivery that posted it first, so no second turn runs: the resume rules above
judge it by the first delivery's mark (see `_duplicate`).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.adapters import SendFailed, can_tell_delivered, idempotent_sends
from switchboard_client.errors import SwitchboardError
from switchboard_client.reply_targets import (
    ReplyKeyRefused,
    ReplySealer,
    ReplyTarget,
    TargetUnreadable,
)

log = logging.getLogger("switchboard_client.gateway")

RECOVERED_MARKER = "[recovered reply: you may have seen this message already]\n"
#: How long a graceful stop lets a periodic step under way finish (a recovered reply
#: going out, then its turn completed) before giving up on it: cut in between, the reply
#: would be delivered with its turn left open.
STEP_DRAIN_S = 10.0

T = TypeVar("T")
OWED = (
    dpb.OBLIGATION_STATE_PENDING,
    dpb.OBLIGATION_STATE_ATTEMPTING,
    dpb.OBLIGATION_STATE_FAILED,
)

#: A row this instance recorded just now (begin_attempt: ATTEMPTING): send it.
_SENDABLE = (dpb.OBLIGATION_STATE_PENDING, dpb.OBLIGATION_STATE_ATTEMPTING)
_SETTLED = (dpb.OBLIGATION_STATE_DELIVERED, dpb.OBLIGATION_STATE_ABANDONED)


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
    """What the agent callback sees.

    `state.state.inbox` holds the user messages this turn answers (oldest first);
    `history` the newest messages before them. `inbound` is the message that
    started the turn, or None when an interrupted turn is resumed after a crash:
    read the pending messages from the inbox, not from `inbound`.
    """

    session: pb.Session
    state: pb.GetSessionStateResponse
    history: Sequence[pb.QueuedMessage]
    inbound: Inbound | None


@dataclass(frozen=True)
class Call:
    """One piece of I/O the rules ask their driver for.

    `target` is "sessions" or "ledger" (a client method), "platform" (a method of
    the adapter named `platform`), "agent" (the callback) or "driver" (the
    driver's own `start_heartbeats`, `start_periodic_claims`,
    `resume_interrupted`, `resume_deferred`). With `collect`, the answer is an
    iterator the driver turns into a list.
    """

    target: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    platform: str = ""
    collect: bool = False


Steps = Generator[Call, Any, T]


def drive(steps: Steps[T], perform: Callable[[Call], Any]) -> T:
    """Runs rules with blocking I/O: each call's answer is sent in, its error thrown in."""
    try:
        call = next(steps)
        while True:
            try:
                answer = perform(call)
            except Exception as error:
                call = steps.throw(error)
            else:
                call = steps.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


async def drive_async(steps: Steps[T], perform: Callable[[Call], Awaitable[Any]]) -> T:
    """`drive`, awaiting each call."""
    try:
        call = next(steps)
        while True:
            try:
                answer = await perform(call)
            except Exception as error:
                call = steps.throw(error)
            else:
                call = steps.send(answer)
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


def _sessions(method: str, *args: Any, **kwargs: Any) -> Call:
    return Call("sessions", method, args, kwargs)


def _ledger(method: str, *args: Any, collect: bool = False, **kwargs: Any) -> Call:
    return Call("ledger", method, args, kwargs, collect=collect)


def _platform(name: str, method: str, *args: Any) -> Call:
    return Call("platform", method, args, platform=name)


def _driver(method: str) -> Call:
    return Call("driver", method)


class GatewayView:
    """What both gateway drivers show of their rules' state."""

    rules: GatewayRules

    @property
    def name(self) -> str:
        return self.rules.name

    @property
    def agent(self) -> str:
        return self.rules.agent

    @property
    def instance_id(self) -> str:
        return self.rules.instance_id

    @property
    def connected(self) -> set[str]:
        return self.rules.connected

    @property
    def deferred(self) -> set[str]:
        """Sessions whose turn a live instance was running when we looked."""
        return self.rules.deferred


class GatewayRules:
    """What a gateway decides, and its bookkeeping; I/O goes through `Call`s."""

    def __init__(
        self,
        name: str,
        agent: str,
        adapters: Sequence[Any],
        history_window: int,
        sealer: ReplySealer | None = None,
    ) -> None:
        self.name = name
        self.agent = agent
        self.adapters: dict[str, Any] = {adapter.name: adapter for adapter in adapters}
        self.history_window = history_window
        #: Seals reply targets (None: no reply key, targets are recorded in clear).
        self.sealer = sealer
        self.instance_id = ""
        self.connected: set[str] = set()
        #: Sessions whose turn a live instance was running when we looked.
        self.deferred: set[str] = set()
        #: The sessions whose inbound messages this process handles now, each delivery
        #: under a token of its own.
        self.handling: dict[object, str] = {}

    # -- life ------------------------------------------------------------------------------

    def boot(self) -> Steps[None]:
        """Hermes' boot order: connect, register, heartbeats, recover owed replies,
        resume turns, then periodic claims. Refuses (`ReplyKeyRefused`) to serve an
        agent that redacts PII without a reply key."""
        yield from self._require_key_for_redaction()
        for name in self.adapters:
            try:
                yield _platform(name, "connect")
                self.connected.add(name)
            except Exception:
                log.exception("platform %s did not connect", name)
        instance = yield _ledger(
            "register",
            self.name,
            sorted(self.connected),
            host=socket.gethostname(),
            pid=os.getpid(),
        )
        self.instance_id = instance.instance_id
        yield _driver("start_heartbeats")
        yield from self.recover()
        yield _driver("resume_interrupted")
        yield _driver("start_periodic_claims")

    def _require_key_for_redaction(self) -> Steps[None]:
        if self.sealer is not None:
            return
        agent: pb.Agent = yield _sessions("get_agent", self.agent)
        if agent.settings.redact_pii:
            raise ReplyKeyRefused(
                f"agent {self.agent!r} redacts PII: give the gateway a reply key (the "
                "reply_key option or SWITCHBOARD_REPLY_KEY, 32 random bytes, e.g. `openssl "
                "rand -hex 32`, the same for every gateway), or its resumed replies have "
                "nowhere to go and raw chat ids reach the delivery ledger"
            )

    def heartbeat(self) -> Steps[None]:
        """One beat: extends the lease and says which platforms are connected."""
        try:
            yield _ledger("heartbeat", self.instance_id, sorted(self.connected))
        except SwitchboardError:
            log.warning("heartbeat of %s failed; trying again at the next beat", self.instance_id)

    def periodic_claim(self) -> Steps[None]:
        """Picks up retries and orphans, and deferred turns whose holder died."""
        try:
            yield from self.recover()
            yield _driver("resume_deferred")
        except SwitchboardError:
            log.warning("periodic claim failed")

    def reconnected(self, platform: str) -> Steps[int]:
        """A platform came back: say so at once and deliver what waited for it."""
        self.connected.add(platform)
        yield _ledger("heartbeat", self.instance_id, sorted(self.connected))
        return (yield from self.recover([platform]))

    def stop(self) -> Steps[None]:
        """Graceful stop (after the driver's loops ended): this instance's unfinished
        rows become claimable at once."""
        if not self.instance_id:
            return
        try:
            yield _ledger("deregister", self.instance_id)
        except SwitchboardError:
            log.warning("deregistering %s failed", self.instance_id)

    # -- turns -----------------------------------------------------------------------------

    def handle(self, inbound: Inbound) -> Steps[str]:
        """One turn for an inbound message; returns the reply that was sent ("" when
        the session had the message already: another delivery's turn, see `_duplicate`)."""
        source = inbound.source
        resolved = yield _sessions(
            "resolve",
            self.agent,
            transport=source.transport,
            conversation_id=source.conversation_id,
            chat_type=source.chat_type,
            chat_id=source.chat_id,
            thread_id=source.thread_id,
            user_id=source.user_id,
            scope_id=source.scope_id,
        )
        session: pb.Session = resolved.session
        message = pb.Message(
            role=pb.ROLE_USER,
            content=inbound.text,
            sender=source.user_id,
            message_ref=inbound.message_ref,
        )
        # Known as handled here from before the post, so that a second delivery of the
        # message to this process, answered `duplicate`, finds this one (`_duplicate`).
        delivery = object()
        self.handling[delivery] = session.session_id
        target = _inbound_target(inbound)
        try:
            # The resume mark and the post in one transaction: a crash never leaves a
            # stored, unmarked message, and a duplicate writes neither. The mark names
            # this instance, so a gateway booting meanwhile leaves the turn to us, and
            # carries the sealed target to answer.
            posted = yield _sessions(
                "post_message",
                self.agent,
                session.session_id,
                message,
                mark_holder=self.instance_id,
                reply_target=self._sealed(target),
            )
            if posted.duplicate:
                return (yield from self._duplicate(session.session_id, inbound, delivery))
            return (yield from self._run_turn(session, inbound, target))
        finally:
            del self.handling[delivery]

    def _duplicate(self, session_id: str, inbound: Inbound, delivery: object) -> Steps[str]:
        """The session accepted this platform message before and this post wrote
        nothing: the turn is the first delivery's, marked by it, and none runs here,
        unless that turn failed in this very process. The resume rules judge it by its
        mark: a live holder finishes it; a dead (or unknown) one's is resumed, now or at
        a periodic claim, as at boot. Returns the reply this call sent ("" for none)."""
        session: pb.Session = yield _sessions("get_session", self.agent, session_id)
        if not session.resume_pending:
            return ""  # the first delivery's turn has ended
        if session.resume_holder != self.instance_id:
            self.deferred.add(session_id)
            yield _driver("resume_deferred")
            return ""
        if session_id in [sid for token, sid in list(self.handling.items()) if token != delivery]:
            # A turn runs here now (the first delivery's, or a later message's): it
            # answers the inbox it read, this message included.
            return ""
        # It failed here (the agent raised; the platform retries): take it up, answering
        # only what no reply covers yet, as a resume does.
        return (yield from self._resume(session, inbound))

    def resume_pass(self, only_deferred: bool) -> Steps[None]:
        """Re-runs the turns a crash cut off, if still fresh (stale ones are reset);
        `only_deferred` looks only at turns deferred before. The driver runs one
        pass at a time, so a turn is never resumed twice at once.

        A turn whose holder is another, live instance is left to it and deferred.
        """
        if only_deferred and not self.deferred:
            return
        # Stale turns are reset, not continued: their users start afresh.
        yield _sessions("expire_resumable", self.agent)
        listed = yield _sessions("list_resumable", self.agent)
        resumable: list[pb.Session] = list(listed.sessions)
        # A deferred turn no longer listed was finished (or reset): forget it.
        self.deferred &= {session.session_id for session in resumable}
        for session in resumable:
            if session.suspended or (only_deferred and session.session_id not in self.deferred):
                continue
            holder = session.resume_holder
            if holder and holder == self.instance_id:
                continue  # running in this process (a turn that failed here: next boot)
            if holder and (yield from self._is_live(holder)):
                self.deferred.add(session.session_id)
                continue
            self.deferred.discard(session.session_id)
            yield from self._resume_safely(session)

    def _is_live(self, instance_id: str) -> Steps[bool]:
        """Whether the instance holding a mark still runs (an empty holder is unknown:
        the caller resumes as before holders existed)."""
        try:
            instance = yield _ledger("instance", instance_id)
            return bool(instance.live)
        except SwitchboardError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return False  # registered with another ledger, or pruned: nobody runs it
            # Unsure: leave the turn alone now and look again at the next periodic claim.
            log.warning("could not tell whether %s is live: %s", instance_id, error)
            return True

    def _resume_safely(self, session: pb.Session) -> Steps[None]:
        """One session's failure (the agent or a platform raising) must not cost the
        others their resume, nor the gateway its start; the mark stays, so a later
        boot retries it while it is fresh."""
        try:
            yield from self._resume(session)
        except Exception:
            log.exception("resuming session %s failed; its mark stays", session.session_id)

    def _resume(self, session: pb.Session, inbound: Inbound | None = None) -> Steps[str]:
        """Answers only what no reply covers yet: an owed reply is redelivered by a
        claim, a delivered one only completes its turn; neither is re-run. `inbound`:
        the platform's retry of the message taking the turn up (its reply goes where
        the message says). Returns the reply sent ("" for none)."""
        key = session.routing_key or session.session_id
        listed: list[dpb.Obligation] = yield _ledger("list", session_key=key, collect=True)
        rows = [row for row in listed if row.metadata.get("session_id") == session.session_id]
        if any(row.state in OWED for row in rows):
            return ""
        delivered = [row for row in rows if row.state == dpb.OBLIGATION_STATE_DELIVERED]
        latest = max(
            delivered, key=lambda row: int(row.metadata.get("inbox_through", "0")), default=None
        )
        answered_through = int(latest.metadata.get("inbox_through", "0")) if latest else 0
        state = yield _sessions("state", self.agent, session.session_id)
        inbox: list[pb.QueuedMessage] = list(state.state.inbox)
        if any(q.sequence > answered_through for q in inbox):
            try:
                target = _inbound_target(inbound) if inbound else self._resumed_target(session)
            except TargetUnreadable as unreadable:
                log.error(
                    "the interrupted turn of session %s is not resumed: %s; its mark is "
                    "cleared and its messages wait in the inbox for the user's next message",
                    session.session_id,
                    unreadable,
                )
                yield _sessions("mark_resumable", self.agent, session.session_id, False)
                return ""
            log.info("resuming interrupted session %s", session.session_id)
            # Take the turn over, so that a gateway booting meanwhile leaves it to us
            # (the mark keeps its time: the freshness window still counts from the crash).
            yield _sessions(
                "mark_resumable",
                self.agent,
                session.session_id,
                True,
                holder=self.instance_id,
                reply_target=session.reply_target or self._sealed(target),
            )
            return (yield from self._run_turn(session, inbound, target))
        if latest is not None and inbox:
            yield from self._finish_turn(
                session.session_id, latest.content, inbox, answered_through
            )
        else:
            yield _sessions("mark_resumable", self.agent, session.session_id, False)
        return ""

    def _resumed_target(self, session: pb.Session) -> ReplyTarget:
        """Where an interrupted turn's reply goes: the target sealed on its mark, else
        (a mark of an older gateway) the session's source, unless its ids are hashed."""
        if session.reply_target:
            if self.sealer is None:
                raise TargetUnreadable("its reply target is sealed and this gateway has no key")
            return self.sealer.open(session.reply_target)
        source = session.source
        if _holds_hashed_ids(source):
            raise TargetUnreadable(
                "its session holds hashed ids (the agent redacts PII) and its mark carries "
                "no sealed reply target"
            )
        return ReplyTarget(
            source.transport, source.chat_id or source.conversation_id, source.thread_id
        )

    def _sealed(self, target: ReplyTarget) -> bytes:
        return b"" if self.sealer is None else self.sealer.seal(target)

    def _run_turn(
        self, session: pb.Session, inbound: Inbound | None, target: ReplyTarget
    ) -> Steps[str]:
        state: pb.GetSessionStateResponse = yield _sessions("state", self.agent, session.session_id)
        history = yield _sessions(
            "history", self.agent, session.session_id, limit=self.history_window, newest=True
        )
        reply: str = yield Call("agent", "__call__", (Turn(session, state, history, inbound),))
        inbox_through = state.state.inbox[-1].sequence if state.state.inbox else 0
        message_ref = inbound.message_ref if inbound else f"resume:{session.last_sequence}"
        # Where the reply belongs, so that a gateway recovering it can finish the turn.
        turn = {
            "agent": self.agent,
            "session_id": session.session_id,
            "inbox_through": str(inbox_through),
        }
        ours = yield from self.deliver(
            session.routing_key or session.session_id,
            message_ref,
            reply,
            target.platform,
            target.chat_id,
            target.thread_id,
            metadata=turn,
        )
        if ours:  # else the instance that owes it finishes the turn when it delivers
            inbox = list(state.state.inbox)
            yield from self._finish_turn(session.session_id, reply, inbox, inbox_through)
        return reply

    def _finish_turn(
        self,
        session_id: str,
        reply: str,
        inbox: Sequence[pb.QueuedMessage],
        inbox_through: int,
    ) -> Steps[None]:
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
        yield _sessions("append", self.agent, session_id, *events)
        yield _sessions("mark_resumable", self.agent, session_id, False)

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
    ) -> Steps[bool]:
        """Records the reply as owed, then sends it; the ledger never blocks the send.

        Sends only a row this call put into ATTEMPTING under this instance. False
        when this very reply was recorded before and someone else finishes its turn:
        another instance (it is delivered, or owed and redelivered by a claim), or
        the claim retrying this instance's failed send. True, without sending, when
        this instance delivered or abandoned it before (a retried inbound event).
        """
        if platform not in self.adapters:
            raise KeyError(f"no platform adapter named {platform!r}")
        # With a key, the row holds the target sealed: no raw chat id reaches the ledger.
        sealed = self._sealed(ReplyTarget(platform, chat_id, thread_id))
        recorded = yield _ledger(
            "record_best_effort",
            self.instance_id,
            session_key=session_key,
            message_ref=message_ref,
            content=content,
            platform=platform,
            chat_id="" if sealed else chat_id,
            thread_id="" if sealed else thread_id,
            sealed_target=sealed,
            metadata=metadata or {},
            begin_attempt=True,
        )
        row: dpb.Obligation | None = recorded.obligation if recorded is not None else None
        if row is None or (row.owner_instance_id == self.instance_id and row.state in _SENDABLE):
            yield from self._send(platform, row, chat_id, thread_id, content, row.id if row else "")
            return True
        log.info(
            "reply %s is recorded already (%s); not sending it again",
            row.id,
            dpb.ObligationState.Name(row.state),
        )
        # This instance settled it before (the platform redelivered the inbound
        # event): the turn is ours to finish. Otherwise whoever holds it, or the
        # claim that retries it, finishes the turn when the reply goes out.
        return row.owner_instance_id == self.instance_id and row.state in _SETTLED

    def recover(self, platforms: Sequence[str] | None = None) -> Steps[int]:
        """Claims what is owed (dead instances' rows, due retries) and redelivers it."""
        claim = yield _ledger(
            "claim_recoverable", self.instance_id, deliverable_platforms=platforms
        )
        claimed: list[dpb.Obligation] = list(claim.obligations)
        for row in claimed:
            if row.platform in self.adapters:
                yield from self._redeliver(row)
        return len(claimed)

    def _redeliver(self, row: dpb.Obligation) -> Steps[None]:
        """One claimed reply: settled by the platform's own record if it can tell,
        else re-sent, with the marker unless the platform drops duplicates."""
        adapter = self.adapters[row.platform]
        idempotent = idempotent_sends(adapter)
        if not idempotent:
            already = yield from self._was_delivered(row)
            if already is not None:
                yield _ledger("mark_delivered", self.instance_id, row, already)
                yield from self._finish_recovered_turn(row)
                return
        try:
            target = self._row_target(row)
        except TargetUnreadable as unreadable:
            log.error(
                "reply %s is not redelivered: %s; it stays claimed by this instance, "
                "unmarked, for a gateway holding the key once this one stops",
                row.id,
                unreadable,
            )
            return
        marker = row.needs_marker and not idempotent
        text = RECOVERED_MARKER + row.content if marker else row.content
        sent = yield from self._send(
            row.platform, row, target.chat_id, target.thread_id, text, row.id
        )
        if sent:
            yield from self._finish_recovered_turn(row)

    def _row_target(self, row: dpb.Obligation) -> ReplyTarget:
        """Where a claimed row goes: its sealed target opened, else its chat in clear."""
        if not row.sealed_target:
            return ReplyTarget(row.platform, row.chat_id, row.thread_id)
        if self.sealer is None:
            raise TargetUnreadable("its target is sealed and this gateway has no reply key")
        target = self.sealer.open(row.sealed_target)
        if target.platform != row.platform:
            raise TargetUnreadable("its sealed target names another platform than the row")
        return target

    def _was_delivered(self, row: dpb.Obligation) -> Steps[str | None]:
        """The optional capability: None (unknown) when absent or when it fails."""
        if not can_tell_delivered(self.adapters[row.platform]):
            return None
        try:
            answer = yield _platform(row.platform, "was_delivered", row.id)
        except Exception:
            log.exception("%s could not tell whether %s arrived", row.platform, row.id)
            return None
        return None if answer is None else str(answer)

    def _finish_recovered_turn(self, row: dpb.Obligation) -> Steps[None]:
        """A redelivered reply completes the turn it came from, so it is not re-run."""
        session_id = row.metadata.get("session_id", "")
        if row.metadata.get("agent") != self.agent or not session_id:
            return
        try:
            answer = yield _sessions("state", self.agent, session_id)
            through = int(row.metadata.get("inbox_through", "0"))
            inbox = [q for q in answer.state.inbox if q.sequence <= through]
            if through and not inbox:
                # Its inbox is drained: the turn ended already, with this reply in the
                # history (its first send failed, and a claim retried it). Nothing to add.
                return
            yield from self._finish_turn(session_id, row.content, inbox, through)
        except SwitchboardError as error:
            log.warning("could not complete the recovered turn of %s: %s", session_id, error)

    def _send(
        self,
        platform: str,
        row: dpb.Obligation | None,
        chat_id: str,
        thread_id: str,
        text: str,
        key: str,
    ) -> Steps[bool]:
        """Sends and records the outcome; True when the platform took the message."""
        try:
            platform_id = yield _platform(platform, "send", chat_id, thread_id, text, key)
        except SendFailed as failed:
            log.warning("send to %s failed: %s", platform, failed)
            yield from self._mark_failed(row, str(failed), failed.retryable, failed.retry_after_s)
            return False
        except Exception as error:
            # Not the adapter's verdict: the send may or may not have gone out, so it
            # is retried, and the retry carries the marker.
            log.exception("send to %s raised; it will be retried", platform)
            yield from self._mark_failed(row, f"{type(error).__name__}: {error}", True, None)
            return False
        if row is not None:
            try:
                yield _ledger("mark_delivered", self.instance_id, row, str(platform_id))
            except SwitchboardError as error:
                log.warning("ledger update failed: %s", error)
        return True

    def _mark_failed(
        self, row: dpb.Obligation | None, error: str, retryable: bool, retry_after_s: float | None
    ) -> Steps[None]:
        if row is None:
            return
        try:
            yield _ledger(
                "mark_failed",
                self.instance_id,
                row,
                error,
                retryable=retryable,
                retry_after_s=retry_after_s,
            )
        except SwitchboardError as ledger_error:
            log.warning("ledger update failed: %s", ledger_error)


def _inbound_target(inbound: Inbound) -> ReplyTarget:
    """Where the reply to an inbound message goes: its reply target, else its source's."""
    source = inbound.source
    return ReplyTarget(
        inbound.reply_platform or source.transport,
        inbound.reply_chat_id or source.chat_id or source.conversation_id,
        source.thread_id,
    )


def _holds_hashed_ids(source: pb.Source) -> bool:
    """Whether a stored source's chat or user id is in the SessionService's hashed
    form (its agent redacts PII): such an id names no chat a platform knows."""
    chat = re.fullmatch(rf"{re.escape(source.transport)}:[0-9a-f]{{12}}", source.chat_id)
    return chat is not None or re.fullmatch(r"user_[0-9a-f]{12}", source.user_id) is not None
