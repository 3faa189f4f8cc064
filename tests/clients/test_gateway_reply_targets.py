"""The gateway rules for agents that redact PII, on both Python gateways, against real
services holding a PII key: the reply target is sealed onto the resume mark and into
the ledger row, a resumed turn and a recovered row are answered at the raw chat, and a
target that does not open is never answered at a hashed id. (Process kills on the
Telegram stand-in: tests/platforms/test_redacting_gateways.py; Node: test_node_gateway.py.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import RECOVERED_MARKER, Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform
from switchboard_client.reply_targets import ReplyKeyRefused, ReplySealer, ReplyTarget

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.clients.gateway_drivers import KINDS, AnyGateway, make_gateway
from tests.harness import EventLoopThread, delivery_server, session_server

PII_KEY = b"gateway reply target tests, 32 b"
REPLY_KEY = bytes(range(100, 132)).hex()
NAME = "tg-bot"
CHAT, THREAD, USER = "-1001987654321", "17585", "u-5550001234"
TOPIC = pb.Source(
    transport="telegram", chat_type=pb.CHAT_TYPE_GROUP, chat_id=CHAT, thread_id=THREAD,
    user_id=USER,
)  # fmt: skip


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
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url, pii_key=PII_KEY) as session,
        delivery_server(loop_thread, database_url, limits, pii_key=PII_KEY) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main", settings=pb.AgentSettings(redact_pii=True))
        yield Services(sessions, ledger, (session.address, delivery.address), request.param)


def echo(turn: Turn) -> str:
    return "answer to " + " + ".join(q.message.content for q in turn.state.state.inbox)


def crashing(turn: Turn) -> str:
    raise RuntimeError("the gateway died while the model was thinking")


def _gateway(
    services: Services, platform: LoopbackPlatform, callback: Any = echo, **options: Any
) -> AnyGateway:
    options.setdefault("reply_key", REPLY_KEY)
    return make_gateway(
        services.kind, NAME, "main", services.addresses, [platform], callback,
        clients=(services.sessions, services.ledger), heartbeat_s=0.2, claim_every_s=3600,
        **options,
    )  # fmt: skip


def _interrupted_turn(services: Services, text: str = "hello") -> pb.Session:
    """A gateway with the key takes a message and dies mid-turn (its agent raised,
    then it stopped): the session keeps the mark and the sealed target."""
    gateway = _gateway(services, LoopbackPlatform(name="telegram"), crashing)
    gateway.start()
    with pytest.raises(RuntimeError, match="while the model was thinking"):
        gateway.handle(Inbound(TOPIC, text, message_ref="m-1"))
    gateway.stop()
    [marked] = services.sessions.list_resumable("main").sessions
    assert marked.resume_pending and marked.reply_target, "the mark carries a sealed target"
    assert ReplySealer(REPLY_KEY).open(marked.reply_target) == ReplyTarget("telegram", CHAT, THREAD)
    assert CHAT not in marked.source.chat_id and THREAD not in marked.source.thread_id
    return marked


def _settled(gateway: AnyGateway, services: Services, row_id: str) -> dpb.Obligation:
    deadline = time.monotonic() + 30
    while True:
        row = services.ledger.get(row_id)
        if row.state not in (dpb.OBLIGATION_STATE_FAILED, dpb.OBLIGATION_STATE_ATTEMPTING):
            return row
        assert time.monotonic() < deadline, f"{row_id} stayed {row.state}"
        gateway.recover()
        time.sleep(0.05)


def test_a_resumed_turn_is_answered_at_the_raw_chat(services: Services) -> None:
    marked = _interrupted_turn(services)
    platform = LoopbackPlatform(name="telegram")
    rescuer = _gateway(services, platform)
    rescuer.start()  # resumes the turn: its holder is dead
    rescuer.stop()
    assert [(s.chat_id, s.thread_id, s.text) for s in platform.sent] == [
        (CHAT, THREAD, "answer to hello")
    ]
    [row] = list(services.ledger.list())
    assert (row.state, row.chat_id, row.thread_id) == (dpb.OBLIGATION_STATE_DELIVERED, "", "")
    assert ReplySealer(REPLY_KEY).open(row.sealed_target) == ReplyTarget("telegram", CHAT, THREAD)
    assert row.session_key.startswith("agent:main:sk_"), "the ledger hashed the session key"
    finished = services.sessions.get_session("main", marked.session_id)
    assert (finished.resume_pending, finished.reply_target) == (False, b"")


class ProcessDied(Exception):
    """The gateway process ending right there."""


def test_a_turn_cut_off_right_after_its_post_is_answered_at_the_raw_chat(
    services: Services,
) -> None:
    """The post carries the mark and the sealed target in one call: a gateway that dies
    the moment its post returns has left everything a rescuer needs to answer."""
    sessions = SessionClient(services.addresses[0])
    crashed = Gateway(
        NAME, "main", sessions, services.ledger, [LoopbackPlatform(name="telegram")], echo,
        heartbeat_s=0.2, claim_every_s=3600, reply_key=REPLY_KEY,
    )  # fmt: skip
    crashed.start()
    post = sessions.post_message

    def post_then_die(*args: Any, **kwargs: Any) -> Any:
        post(*args, **kwargs)
        raise ProcessDied

    sessions.post_message = post_then_die
    with pytest.raises(ProcessDied):
        crashed.handle(Inbound(TOPIC, "hello", message_ref="m-1"))
    crashed.stop()
    sessions.close()
    [marked] = services.sessions.list_resumable("main").sessions
    assert ReplySealer(REPLY_KEY).open(marked.reply_target) == ReplyTarget("telegram", CHAT, THREAD)

    platform = LoopbackPlatform(name="telegram")
    rescuer = _gateway(services, platform)
    rescuer.start()
    rescuer.stop()
    assert [(s.chat_id, s.thread_id, s.text) for s in platform.sent] == [
        (CHAT, THREAD, "answer to hello")
    ]


def test_a_target_sealed_with_another_key_is_not_answered_and_waits_for_the_next_message(
    services: Services,
) -> None:
    marked = _interrupted_turn(services)
    platform = LoopbackPlatform(name="telegram")
    other = _gateway(services, platform, reply_key=os.urandom(32).hex())
    other.start()
    try:
        assert platform.sent == [], "nothing sent to a hashed id, nor anywhere"
        assert list(services.ledger.list()) == [], "the ledger is untouched"
        session = services.sessions.get_session("main", marked.session_id)
        assert not session.resume_pending, "given up: the mark is cleared"
        inbox = services.sessions.state("main", marked.session_id).state.inbox
        assert [q.message.content for q in inbox] == ["hello"], "the message waits"
        # The user's next message is a turn of its own, answering both.
        other.handle(Inbound(TOPIC, "anyone?", message_ref="m-2"))
    finally:
        other.stop()
    assert [(s.chat_id, s.text) for s in platform.sent] == [(CHAT, "answer to hello + anyone?")]


def test_an_old_mark_on_a_hashed_session_is_not_answered_at_the_hashed_id(
    services: Services,
) -> None:
    """A mark set without a sealed target (by a gateway of an older release)."""
    session = services.sessions.resolve(
        "main", transport="telegram", chat_type=pb.CHAT_TYPE_GROUP, chat_id=CHAT,
        thread_id=THREAD, user_id=USER,
    ).session  # fmt: skip
    services.sessions.mark_resumable("main", session.session_id, holder="")
    message = pb.Message(role=pb.ROLE_USER, content="hello", sender=USER)
    services.sessions.post_to_inbox("main", session.session_id, message)
    platform = LoopbackPlatform(name="telegram")
    gateway = _gateway(services, platform)
    gateway.start()
    gateway.stop()
    assert platform.sent == [] and list(services.ledger.list()) == []
    assert not services.sessions.get_session("main", session.session_id).resume_pending


def test_a_gateway_without_a_reply_key_refuses_to_serve_a_redacting_agent(
    services: Services,
) -> None:
    gateway = _gateway(services, LoopbackPlatform(name="telegram"), reply_key=None)
    with pytest.raises(ReplyKeyRefused, match="agent 'main' redacts PII: give the gateway a reply"):
        gateway.start()
    assert list(services.ledger.list_instances()) == [], "refused before registering"
    with pytest.raises(ReplyKeyRefused, match="not random"):
        _gateway(services, LoopbackPlatform(name="telegram"), reply_key="0" * 64)


def test_a_recovered_row_is_redelivered_at_the_raw_chat(services: Services) -> None:
    failing = LoopbackPlatform(name="telegram", mode="fail")
    first = _gateway(services, failing)
    first.start()
    first.handle(Inbound(TOPIC, "hello", message_ref="m-1"))  # the send fails: retried later
    first.stop()
    [row] = list(services.ledger.list())
    assert (row.state, row.chat_id, row.thread_id) == (dpb.OBLIGATION_STATE_FAILED, "", "")
    platform = LoopbackPlatform(name="telegram")
    rescuer = _gateway(services, platform)
    rescuer.start()
    try:
        delivered = _settled(rescuer, services, row.id)
    finally:
        rescuer.stop()
    assert delivered.state == dpb.OBLIGATION_STATE_DELIVERED
    assert [(s.chat_id, s.thread_id, s.text) for s in platform.sent] == [
        (CHAT, THREAD, RECOVERED_MARKER + "answer to hello")
    ]


def test_a_claimed_row_that_does_not_open_stays_claimed_for_a_gateway_with_the_key(
    services: Services,
) -> None:
    first = _gateway(services, LoopbackPlatform(name="telegram", mode="fail"))
    first.start()
    first.handle(Inbound(TOPIC, "hello", message_ref="m-1"))
    first.stop()
    [row] = list(services.ledger.list())
    wrong = LoopbackPlatform(name="telegram")
    other = _gateway(services, wrong, reply_key=os.urandom(32).hex())
    other.start()
    try:
        deadline = time.monotonic() + 30
        while services.ledger.get(row.id).state != dpb.OBLIGATION_STATE_ATTEMPTING:
            assert time.monotonic() < deadline, "the row was never claimed"
            other.recover()
            time.sleep(0.05)
        held = services.ledger.get(row.id)
        assert held.owner_instance_id == other.instance_id and held.last_error == row.last_error
        other.recover()
        assert services.ledger.get(row.id) == held, "left as claimed: not marked, not re-claimed"
    finally:
        other.stop()  # its rows become claimable at once
    assert wrong.sent == []
    platform = LoopbackPlatform(name="telegram")
    rescuer = _gateway(services, platform)
    rescuer.start()
    try:
        assert _settled(rescuer, services, row.id).state == dpb.OBLIGATION_STATE_DELIVERED
    finally:
        rescuer.stop()
    assert [(s.chat_id, s.thread_id) for s in platform.sent] == [(CHAT, THREAD)]
