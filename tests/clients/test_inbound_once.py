"""One platform message, one turn, however many gateway instances get it.

A platform retries an update, or hands it to two instances of the bot: the session
accepts the message once, and the instance whose post comes back `duplicate` runs no
turn. The agent here numbers its replies, as a model answers differently each time:
a second turn would be a second reply (and a second ledger row). Each test runs on
both gateways (threaded and asyncio), both backends, real services.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Turn
from switchboard_client.loopback import LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.clients.gateway_drivers import KINDS, AnyGateway, make_gateway
from tests.clients.gateway_process import INBOUND, NAME
from tests.harness import EventLoopThread, delivery_server, session_server

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Services:
    sessions: SessionClient
    ledger: DeliveryClient
    addresses: tuple[str, str]
    kind: str


@pytest.fixture(params=KINDS)
def services(
    database_url: str, loop_thread: EventLoopThread, request: pytest.FixtureRequest
) -> Iterator[Services]:
    # A killed gateway is dead a second after its last heartbeat.
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Services(sessions, ledger, (session.address, delivery.address), request.param)


class Model:
    """An agent that numbers its replies across every gateway of the test, and may
    be held mid-thought."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.thinking = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self._numbers = itertools.count(1)

    def __call__(self, turn: Turn) -> str:
        self.turns.append(turn)
        self.thinking.set()
        assert self.release.wait(60), "never released"
        return f"reply #{next(self._numbers)}"


def _gateway(services: Services, platform: LoopbackPlatform, model: Model) -> AnyGateway:
    gateway = make_gateway(
        services.kind, NAME, "main", services.addresses, [platform], model,
        heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip
    gateway.start()
    return gateway


def _session(services: Services) -> pb.Session:
    source = INBOUND.source
    return services.sessions.resolve(
        "main",
        transport=source.transport,
        chat_type=source.chat_type,
        chat_id=source.chat_id,
        user_id=source.user_id,
    ).session


def _history(services: Services) -> list[str]:
    messages = services.sessions.history("main", _session(services).session_id, limit=100)
    return [q.message.content for q in messages]


def _assert_one_turn_answered(services: Services, reply: str) -> None:
    [row] = list(services.ledger.list())
    assert (row.state, row.content) == (dpb.OBLIGATION_STATE_DELIVERED, reply)
    assert _history(services) == [INBOUND.text, reply], "the message once, one reply"
    assert list(services.sessions.list_resumable("main").sessions) == [], "no mark left"


def test_the_same_message_given_to_a_second_instance_after_its_turn_runs_no_turn(
    services: Services,
) -> None:
    model, platform = Model(), LoopbackPlatform()
    first, second = _gateway(services, platform, model), _gateway(services, platform, model)
    try:
        assert first.handle(INBOUND) == "reply #1"
        assert second.handle(INBOUND) == "", "the update reached a second instance"
        assert first.handle(INBOUND) == "", "the platform retried to the first"
    finally:
        first.stop()
        second.stop()
    assert len(model.turns) == 1
    assert [s.text for s in platform.sent] == ["reply #1"]
    _assert_one_turn_answered(services, "reply #1")


def test_the_same_message_given_to_a_second_instance_mid_turn_is_left_to_the_first(
    services: Services,
) -> None:
    model, platform = Model(), LoopbackPlatform()
    model.release.clear()
    first, second = _gateway(services, platform, model), _gateway(services, platform, model)
    answers: list[str] = []
    running = threading.Thread(target=lambda: answers.append(first.handle(INBOUND)))
    running.start()
    try:
        assert model.thinking.wait(60), "the first instance's turn never began"
        assert second.handle(INBOUND) == ""
        assert second.deferred == {_session(services).session_id}, "left to its live holder"
        [marked] = services.sessions.list_resumable("main").sessions
        assert marked.resume_holder == first.instance_id, "the mark is the first's again"
        model.release.set()
        running.join(60)
        second.resume_deferred()  # the turn is over: nothing to look at any more
        assert second.deferred == set()
    finally:
        model.release.set()
        running.join(60)
        first.stop()
        second.stop()
    assert answers == ["reply #1"]
    assert len(model.turns) == 1
    assert [s.text for s in platform.sent] == ["reply #1"]
    _assert_one_turn_answered(services, "reply #1")


def test_the_same_message_given_twice_to_one_instance_mid_turn_runs_one_turn(
    services: Services,
) -> None:
    """A platform retrying while the turn runs, through an adapter that does not keep
    its own list of running events (the Slack adapter does): the instance knows the
    turn runs here and leaves it be."""
    model, platform = Model(), LoopbackPlatform()
    model.release.clear()
    gateway = _gateway(services, platform, model)
    answers: list[str] = []
    running = threading.Thread(target=lambda: answers.append(gateway.handle(INBOUND)))
    running.start()
    try:
        assert model.thinking.wait(60), "the turn never began"
        assert gateway.handle(INBOUND) == ""
        [marked] = services.sessions.list_resumable("main").sessions
        assert marked.resume_holder == gateway.instance_id
    finally:
        model.release.set()
        running.join(60)
        gateway.stop()
    assert answers == ["reply #1"]
    assert len(model.turns) == 1
    _assert_one_turn_answered(services, "reply #1")


def _die_in_the_agent(services: Services) -> pb.Session:
    """A gateway process posts INBOUND, marks it as its turn and dies while its agent
    thinks: nothing answered, nothing recorded."""
    command = [
        sys.executable, "-m", "tests.clients.gateway_process", *services.addresses,
        "--die-in-agent", *(["--async"] if services.kind == "async" else []),
    ]  # fmt: skip
    crashed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert crashed.returncode == -9, crashed.stderr
    [marked] = services.sessions.list_resumable("main").sessions
    assert list(services.ledger.list()) == []
    return marked


def _wait_until(condition: Callable[[], bool], what: str, tick: Callable[[], object]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        tick()
        time.sleep(0.1)


def test_a_retry_of_a_message_whose_instance_died_mid_turn_is_resumed_once(
    services: Services,
) -> None:
    """The platform retries the update to another instance: its post is a duplicate,
    and the turn is still the dead instance's. It must not be dropped: the duplicate
    leaves the dead instance's mark as it was, and the instance that got the retry
    hands the turn to the resume rules, which resume it once they see the holder
    dead (at once, or at a periodic claim once its lease has run out)."""
    model, platform = Model(), LoopbackPlatform()
    rescuer = _gateway(services, platform, model)  # booted before: its boot saw no mark
    try:
        marked = _die_in_the_agent(services)
        assert rescuer.handle(INBOUND) == ""
        _wait_until(lambda: bool(platform.sent), "the turn was dropped", rescuer.resume_deferred)
    finally:
        rescuer.stop()
    [turn] = model.turns
    assert turn.inbound is None, "resumed by the resume rules"
    assert [q.message.content for q in turn.state.state.inbox] == [INBOUND.text]
    assert [(s.chat_id, s.text) for s in platform.sent] == [("chat-1", "reply #1")]
    _assert_one_turn_answered(services, "reply #1")
    assert services.sessions.get_session("main", marked.session_id).resume_holder == ""
