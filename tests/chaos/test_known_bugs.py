"""Minimal, deterministic reproductions of the gateway bugs the chaos rounds found.

Fixed ones stay as regression tests. An open one is a strict xfail: it documents
the bug and fails (XPASS) the day the bug is fixed, so that it can become a
regression test too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.clients.gateway_drivers import KINDS, AnyGateway, make_gateway
from tests.harness import EventLoopThread, delivery_server, session_server

pytestmark = [pytest.mark.chaos]

DM = pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1")
#: A crashed gateway is dead this long after its last heartbeat; live ones beat every 0.2 s.
LEASE_TTL_S = 1.0


class ProcessDied(Exception):
    """Stands for a SIGKILL at this point of the gateway's code."""


class DiesFinishingTheTurn(Gateway):
    """A gateway process killed after MarkDelivered, while finishing the turn: before
    the history append, or after it but before the resume mark is cleared."""

    def __init__(self, *args: Any, after_append: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        append = self.sessions.append

        def finishing(*append_args: Any, **append_kwargs: Any) -> Any:
            # The turn's only append is the one finishing it, after MarkDelivered.
            if not after_append:
                raise ProcessDied
            answer = append(*append_args, **append_kwargs)
            self.sessions.mark_resumable = _dies
            return answer

        self.sessions.append = finishing


def _dies(*_args: Any, **_kwargs: Any) -> Any:
    raise ProcessDied


def echo(turn: Turn) -> str:
    """Answers the newest user message: the inbox's, else the history's."""
    if turn.state.state.inbox:
        return f"answer to {turn.state.state.inbox[-1].message.content}"
    asked = [q.message.content for q in turn.history if q.message.role == pb.ROLE_USER]
    return f"answer to {asked[-1] if asked else '(nothing)'}"


@dataclass
class Clients:
    sessions: SessionClient
    ledger: DeliveryClient
    session_address: str
    delivery_address: str


@pytest.fixture
def clients(database_url: str, loop_thread: EventLoopThread) -> Iterator[Clients]:
    limits = LedgerLimits(lease_ttl_s=LEASE_TTL_S)
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Clients(sessions, ledger, session.address, delivery.address)


def _gateway(clients: Clients, platform: LoopbackPlatform, agent: Any = echo) -> Gateway:
    return Gateway(
        "gw", "main", clients.sessions, clients.ledger, [platform], agent,
        heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip


def _booting(clients: Clients, kind: str, platform: LoopbackPlatform) -> AnyGateway:
    """The gateway that boots while (or after) another one runs a turn, of `kind`."""
    return make_gateway(
        kind, "gw", "main", (clients.session_address, clients.delivery_address), [platform],
        echo, clients=(clients.sessions, clients.ledger), heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip


#: The booting gateway's resume rules hold on both gateways.
both = pytest.mark.parametrize("kind", KINDS)


def _crash(gateway: Gateway) -> None:
    """The process is gone: no more heartbeats, and no deregistration."""
    gateway._stop.set()


def _wait_until_dead(ledger: DeliveryClient, instance_id: str) -> None:
    """Until the ledger, on its own clock, says the crashed instance's lease has run out."""
    deadline = time.monotonic() + 10 * LEASE_TTL_S
    while ledger.instance(instance_id).live:
        assert time.monotonic() < deadline, f"{instance_id} is still live"
        time.sleep(0.1)


@pytest.mark.parametrize("after_append", [False, True], ids=["before-append", "after-append"])
def test_a_turn_delivered_before_the_crash_is_not_sent_again(
    clients: Clients, after_append: bool
) -> None:
    sessions, ledger = clients.sessions, clients.ledger
    first_platform = LoopbackPlatform()
    crashed = DiesFinishingTheTurn(
        "gw",
        "main",
        SessionClient(clients.session_address),  # its own: the crash is patched into it
        ledger,
        [first_platform],
        echo,
        heartbeat_s=0.2,
        claim_every_s=3600,
        after_append=after_append,
    )
    crashed.start()
    with pytest.raises(ProcessDied):
        crashed.handle(Inbound(DM, "hello", message_ref="m-1"))
    _crash(crashed)
    assert [s.text for s in first_platform.sent] == ["answer to hello"]
    [row] = list(ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    _wait_until_dead(ledger, crashed.instance_id)

    second_platform = LoopbackPlatform()
    restarted = _gateway(clients, second_platform)
    restarted.start()  # register → claim (nothing owed) → resume fresh interrupted turns
    restarted.stop()

    # Before 4564d9b: ["answer to hello"] again, unmarked, under a second ledger row.
    assert [s.text for s in second_platform.sent] == [], "the user got the reply twice"
    [session] = list(sessions.list_sessions("main"))
    assert not session.resume_pending, "the turn was completed, not left resumable"
    assert [q.message.content for q in sessions.history("main", session.session_id)] == [
        "hello",
        "answer to hello",
    ]


@both
def test_a_booting_gateway_does_not_rerun_a_live_gateways_turn(clients: Clients, kind: str) -> None:
    """Before d11aa91: the booting gateway re-ran the turn in resume_interrupted (the
    mark did not say whose turn it was), and the user got two replies."""
    thinking, answer_now = threading.Event(), threading.Event()

    def slow_agent(turn: Turn) -> str:
        thinking.set()
        answer_now.wait(30)  # a model call in progress
        return echo(turn)

    live_platform, booting_platform = LoopbackPlatform(), LoopbackPlatform()
    live = _gateway(clients, live_platform, slow_agent)
    live.start()
    booting = _booting(clients, kind, booting_platform)
    turn = threading.Thread(target=live.handle, args=(Inbound(DM, "hello", message_ref="m-1"),))
    turn.start()
    try:
        assert thinking.wait(30)
        time.sleep(2 * LEASE_TTL_S)  # a long model call: the live gateway's heartbeats go on
        booting.start()  # a second replica, a rolling deploy, a scale-up ...
        [session] = list(clients.sessions.list_sessions("main"))
        assert session.resume_holder == live.instance_id
        assert booting.deferred == {session.session_id}, "left to the live gateway"
    finally:
        answer_now.set()
        turn.join(timeout=30)
        live.stop()
    booting.resume_deferred()  # the periodic look: the turn was finished meanwhile
    booting.stop()
    assert [s.text for s in live_platform.sent] == ["answer to hello"]
    assert [s.text for s in booting_platform.sent] == [], "the user got the reply twice"
    assert booting.deferred == set()
    assert not clients.sessions.get_session("main", session.session_id).resume_pending


def _died_mid_turn(clients: Clients, chat_id: str, text: str) -> str:
    """A gateway instance died in the middle of a turn: marked, stored, never answered."""
    dead = clients.ledger.register("gw", ["loopback"])
    clients.ledger.deregister(dead.instance_id)
    session = clients.sessions.resolve(
        "main", transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id=chat_id, user_id="u1"
    ).session
    clients.sessions.mark_resumable("main", session.session_id, holder=dead.instance_id)
    clients.sessions.post_to_inbox(
        "main", session.session_id, pb.Message(role=pb.ROLE_USER, content=text, sender="u1")
    )
    return session.session_id


@both
def test_a_booting_gateway_does_not_rerun_a_turn_another_gateway_resumed(
    clients: Clients, kind: str
) -> None:
    """Before this test: a resumed turn kept the dead holder's mark, so a gateway booting
    while it ran (waiting for the model) took it for an orphan and answered it too."""
    session_id = _died_mid_turn(clients, "chat-1", "hello")
    thinking, answer_now = threading.Event(), threading.Event()

    def slow_agent(turn: Turn) -> str:
        thinking.set()
        answer_now.wait(30)
        return echo(turn)

    resuming_platform, booting_platform = LoopbackPlatform(), LoopbackPlatform()
    resuming = _gateway(clients, resuming_platform, slow_agent)
    booting = _booting(clients, kind, booting_platform)
    boot = threading.Thread(target=resuming.start)  # resumes the dead instance's turn
    boot.start()
    try:
        assert thinking.wait(30)
        booting.start()
        assert booting.deferred == {session_id}, "left to the gateway resuming it"
        holder = clients.sessions.get_session("main", session_id).resume_holder
        assert holder == resuming.instance_id, "the resuming gateway took the turn over"
    finally:
        answer_now.set()
        boot.join(timeout=30)
        resuming.stop()
    booting.resume_deferred()
    booting.stop()
    assert [s.text for s in resuming_platform.sent] == ["answer to hello"]
    assert [s.text for s in booting_platform.sent] == [], "the user got the reply twice"


@both
def test_a_message_stored_before_the_crash_is_answered_after_the_restart(
    clients: Clients, kind: str
) -> None:
    """A crash right after PostToInbox: the stored message is answered after the restart.

    Before 4564d9b the gateway posted first and marked the session resumable second;
    a crash between them left the message in the inbox with no mark and no ledger
    row, and no restart ever answered it.
    """
    crashed_sessions = SessionClient(clients.session_address)
    crashed = Gateway(
        "gw", "main", crashed_sessions, clients.ledger, [LoopbackPlatform()], echo,
        heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip
    crashed.start()
    post = crashed_sessions.post_message  # the post that also sets the turn's mark

    def post_then_die(*args: Any, **kwargs: Any) -> Any:
        post(*args, **kwargs)
        raise ProcessDied

    crashed_sessions.post_message = post_then_die
    with pytest.raises(ProcessDied):
        crashed.handle(Inbound(DM, "hello", message_ref="m-1"))
    _crash(crashed)
    [session] = list(clients.sessions.list_sessions("main"))
    inbox = clients.sessions.state("main", session.session_id).state.inbox
    assert [q.message.content for q in inbox] == ["hello"], "the message was stored"
    assert session.resume_holder == crashed.instance_id

    platform = LoopbackPlatform()
    restarted = _booting(clients, kind, platform)
    # A restart quicker than the lease: the crashed instance still looks live, so its
    # turn is deferred, and resumed by the periodic look once its lease has run out.
    restarted.start()
    try:
        assert platform.sent == [] and restarted.deferred == {session.session_id}
        _wait_until_dead(clients.ledger, crashed.instance_id)
        restarted.resume_deferred()
    finally:
        restarted.stop()
    assert [s.text for s in platform.sent] == ["answer to hello"], "the user got no reply"
    assert not clients.sessions.get_session("main", session.session_id).resume_pending


class Boom(Exception):
    """The agent (a model API, a tool) failed."""


def test_a_failing_resumed_turn_neither_stops_the_boot_nor_the_other_resumes(
    clients: Clients,
) -> None:
    """Before d11aa91: the agent's exception escaped Gateway.start(), so the gateway did
    not start, and the interrupted sessions after the failing one were not resumed."""
    session_ids = [
        _died_mid_turn(clients, chat, text)
        for chat, text in (("chat-1", "boom"), ("chat-2", "hello"))
    ]
    listed = [s.session_id for s in clients.sessions.list_resumable("main").sessions]
    assert listed == session_ids, "the failing turn is resumed first"

    def flaky_agent(turn: Turn) -> str:
        if turn.state.state.inbox[-1].message.content == "boom":
            raise Boom("the model API is down")
        return echo(turn)

    platform = LoopbackPlatform()
    gateway = _gateway(clients, platform, flaky_agent)
    gateway.start()  # must not raise
    gateway.stop()
    assert [s.text for s in platform.sent] == ["answer to hello"]
    failed, answered = (clients.sessions.get_session("main", s) for s in session_ids)
    assert failed.resume_pending, "the failed turn stays marked for a later boot"
    assert not answered.resume_pending
