"""Minimal, deterministic reproductions of the gateway bugs the chaos rounds found.

Fixed ones stay as regression tests. An open one is a strict xfail: it documents
the bug and fails (XPASS) the day the bug is fixed, so that it can become a
regression test too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, delivery_server, session_server

pytestmark = [pytest.mark.chaos]

DM = pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1")


class ProcessDied(Exception):
    """Stands for a SIGKILL at this point of the gateway's code."""


class DiesFinishingTheTurn(Gateway):
    """A gateway process killed after MarkDelivered, while finishing the turn: before
    the history append, or after it but before the resume mark is cleared."""

    def __init__(self, *args: Any, after_append: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after_append = after_append

    def _finish_turn(
        self,
        session_id: str,
        reply: str,
        inbox: Sequence[pb.QueuedMessage],
        inbox_through: int,
    ) -> None:
        if self.after_append:
            self.sessions.mark_resumable = _dies  # type: ignore[method-assign]
            super()._finish_turn(session_id, reply, inbox, inbox_through)
        raise ProcessDied


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


@pytest.fixture
def clients(database_url: str, loop_thread: EventLoopThread) -> Iterator[Clients]:
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Clients(sessions, ledger, session.address)


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
        claim_every_s=3600,
        after_append=after_append,
    )
    crashed.start()
    with pytest.raises(ProcessDied):
        crashed.handle(Inbound(DM, "hello", message_ref="m-1"))
    crashed._stop.set()  # its threads die with it (no deregistration: it crashed)
    assert [s.text for s in first_platform.sent] == ["answer to hello"]
    [row] = list(ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED

    second_platform = LoopbackPlatform()
    restarted = Gateway("gw", "main", sessions, ledger, [second_platform], echo)
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


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="BUG (reference gateway): a gateway that boots while another, live gateway is "
    "in the middle of a turn (e.g. waiting for the LLM) re-runs that turn in "
    "resume_interrupted: the resume mark does not say whose turn it is or whether its "
    "gateway is alive, so the user gets two replies",
)
def test_a_booting_gateway_does_not_rerun_a_live_gateways_turn(clients: Clients) -> None:
    sessions, ledger = clients.sessions, clients.ledger
    thinking, answer_now = threading.Event(), threading.Event()

    def slow_agent(turn: Turn) -> str:
        thinking.set()
        answer_now.wait(30)  # a model call in progress
        return echo(turn)

    live_platform = LoopbackPlatform()
    live = Gateway("gw", "main", sessions, ledger, [live_platform], slow_agent, claim_every_s=3600)
    live.start()
    turn = threading.Thread(target=live.handle, args=(Inbound(DM, "hello", message_ref="m-1"),))
    turn.start()
    try:
        assert thinking.wait(30)
        booting_platform = LoopbackPlatform()
        booting = Gateway("gw", "main", sessions, ledger, [booting_platform], echo)
        booting.start()  # a second replica, a rolling deploy, a scale-up ...
        booting.stop()
    finally:
        answer_now.set()
        turn.join(timeout=30)
        live.stop()
    assert [s.text for s in live_platform.sent] == ["answer to hello"]
    # Today: ["answer to hello"]: the booting gateway answered the live gateway's turn too.
    assert [s.text for s in booting_platform.sent] == [], "the user got the reply twice"


def test_a_message_stored_before_the_crash_is_answered_after_the_restart(
    clients: Clients,
) -> None:
    """A crash right after PostToInbox: the stored message is answered after the restart.

    Before 4564d9b the gateway posted first and marked the session resumable second;
    a crash between them left the message in the inbox with no mark and no ledger
    row, and no restart ever answered it.
    """
    crashed_sessions = SessionClient(clients.session_address)
    crashed = Gateway(
        "gw", "main", crashed_sessions, clients.ledger, [LoopbackPlatform()], echo,
        claim_every_s=3600,
    )  # fmt: skip
    crashed.start()
    post = crashed_sessions.post_to_inbox

    def post_then_die(*args: Any, **kwargs: Any) -> Any:
        post(*args, **kwargs)
        raise ProcessDied

    crashed_sessions.post_to_inbox = post_then_die  # type: ignore[method-assign]
    with pytest.raises(ProcessDied):
        crashed.handle(Inbound(DM, "hello", message_ref="m-1"))
    crashed._stop.set()
    [session] = list(clients.sessions.list_sessions("main"))
    inbox = clients.sessions.state("main", session.session_id).state.inbox
    assert [q.message.content for q in inbox] == ["hello"], "the message was stored"

    platform = LoopbackPlatform()
    restarted = Gateway("gw", "main", clients.sessions, clients.ledger, [platform], echo)
    restarted.start()
    restarted.stop()
    assert [s.text for s in platform.sent] == ["answer to hello"], "the user got no reply"
