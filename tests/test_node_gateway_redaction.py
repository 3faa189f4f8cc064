"""The Node reference gateway for an agent that redacts PII (clients/node/src/gateway.js,
reply-targets.js), against services holding a PII key: a Node gateway killed mid-turn
or between its send and the ledger's mark, and the next gateway (Node, or the Python
one opening what Node sealed) answers the raw chat; a target sealed with another key is
never answered; no key, no start. The processes and helpers of test_node_gateway.py."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import RECOVERED_MARKER, Gateway, Turn
from switchboard_client.loopback import LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, delivery_server, session_server
from tests.test_node_gateway import (
    ANSWER,
    GATEWAY,
    QUESTION,
    NodeGateway,
    Services,
    sends,
    wait_for,
)
from tests.test_node_gateway import node_modules as node_modules  # the autouse fixture

pytestmark = pytest.mark.slow

PII_KEY = b"node gateway redaction tests, 32"
REPLY_KEY = bytes(range(50, 82)).hex()
RESCUERS = ["node", "python"]


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url, pii_key=PII_KEY) as session,
        delivery_server(loop_thread, database_url, limits, pii_key=PII_KEY) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main", settings=pb.AgentSettings(redact_pii=True))
        yield Services(sessions, ledger, session.address, delivery.address)


@pytest.fixture
def node_gateways(tmp_path: Path, services: Services) -> Iterator[Callable[..., NodeGateway]]:
    """Starts Node gateways on the redacting services; every one left running is killed."""
    started: list[NodeGateway] = []

    def start(file: str = "sends.jsonl", **config: object) -> NodeGateway:
        started.append(NodeGateway(services, tmp_path / file, **config))
        return started[-1]

    yield start
    for gateway in started:
        if gateway.process.poll() is None:
            gateway.kill()


def _resumable(services: Services) -> list[pb.Session]:
    return list(services.sessions.list_resumable("main").sessions)


def _rescue(
    kind: str,
    services: Services,
    node_gateways: Callable[..., NodeGateway],
    file: Path,
    done: Callable[[], bool],
) -> list[tuple[str, str]]:
    """A gateway of `kind` with the reply key runs until `done`; what it sent (chat, text)."""
    if kind == "node":
        rescuer = node_gateways(file.name, claimEveryMs=200, replyKey=REPLY_KEY)
        rescuer.call("start")
        wait_for(done, "the rescue", tick=lambda: rescuer.call("recover"))
        rescuer.stop()
        return [(sent["chatId"], sent["text"]) for sent in sends(file)]

    def echo(turn: Turn) -> str:
        return f"answer to {turn.state.state.inbox[-1].message.content}"

    platform = LoopbackPlatform()
    gateway = Gateway(
        GATEWAY, "main", services.sessions, services.ledger, [platform], echo,
        heartbeat_s=0.2, claim_every_s=0.2, reply_key=REPLY_KEY,
    )  # fmt: skip
    gateway.start()
    try:
        wait_for(done, "the rescue", tick=gateway.recover)
    finally:
        gateway.stop()
    return [(sent.chat_id, sent.text) for sent in platform.sent]


def _killed_mid_turn(node_gateways: Callable[..., NodeGateway], services: Services) -> None:
    holder = node_gateways("holder.jsonl", callback="hang", leaseTtlS=2.0, replyKey=REPLY_KEY)
    holder.call("start")
    holder.handle("hello", "m-1")  # never answered: the agent is "thinking"
    assert holder.event()["resumed"] is False
    [marked] = _resumable(services)
    assert marked.reply_target and marked.source.chat_id.startswith("loopback:"), "hashed"
    holder.kill()


def test_a_node_gateway_posts_the_message_the_mark_and_the_sealed_target_at_once(
    services: Services, node_gateways: Callable[..., NodeGateway]
) -> None:
    """One PostToInbox: the mark it logs carries the sealed target, and no second mark
    follows (a crash between two calls would leave a mark with nowhere to answer)."""
    _killed_mid_turn(node_gateways, services)
    [marked] = _resumable(services)
    kinds = [
        entry.event.WhichOneof("body")
        for entry in services.sessions.list_log_events(session_id=marked.session_id)
    ]
    assert kinds[-2:] == ["resume_marked", "inbox_posted"] and kinds.count("resume_marked") == 1
    assert marked.reply_target, "the mark carries the sealed target"


@pytest.mark.parametrize("rescuer", RESCUERS)
def test_a_node_turn_killed_mid_model_is_resumed_at_the_raw_chat(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path, rescuer: str
) -> None:
    _killed_mid_turn(node_gateways, services)
    sent = _rescue(
        rescuer, services, node_gateways, tmp_path / "rescuer.jsonl",
        lambda: _resumable(services) == [],
    )  # fmt: skip
    assert sent == [("chat-1", "answer to hello")], "the raw chat, not loopback:<digest>"
    assert sends(tmp_path / "holder.jsonl") == []
    [row] = list(services.ledger.list())
    assert (row.state, row.chat_id, row.thread_id) == (dpb.OBLIGATION_STATE_DELIVERED, "", "")
    assert row.sealed_target and row.session_key.startswith("agent:main:sk_")


@pytest.mark.parametrize("rescuer", RESCUERS)
def test_a_node_reply_killed_before_its_mark_is_redelivered_at_the_raw_chat(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path, rescuer: str
) -> None:
    file = tmp_path / "node.jsonl"
    crashing = node_gateways(
        file.name, platform={"mode": "die-after-send"}, leaseTtlS=None, replyKey=REPLY_KEY
    )
    crashing.call("start")
    crashing.handle(QUESTION, "m-1")
    crashing.wait_killed()
    assert [(s["chatId"], s["text"]) for s in sends(file)] == [("chat-1", ANSWER)]
    [owed] = list(services.ledger.list())
    assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING
    assert (owed.chat_id, owed.thread_id) == ("", "") and owed.sealed_target

    def delivered() -> bool:
        return services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED

    sent = _rescue(rescuer, services, node_gateways, tmp_path / "rescuer.jsonl", delivered)
    assert sent == [("chat-1", RECOVERED_MARKER + ANSWER)]


def test_a_node_gateway_with_another_key_leaves_the_turn_unanswered(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    _killed_mid_turn(node_gateways, services)
    other = node_gateways("other.jsonl", claimEveryMs=200, replyKey=os.urandom(32).hex())
    other.call("start")
    wait_for(lambda: _resumable(services) == [], "the mark was not cleared")
    other.stop()
    assert sends(tmp_path / "other.jsonl") == [] and list(services.ledger.list()) == []
    assert "is not resumed: the sealed reply target does not open" in other.log()


def test_an_old_mark_on_a_hashed_session_is_not_answered_at_the_hashed_id(
    services: Services, node_gateways: Callable[..., NodeGateway], tmp_path: Path
) -> None:
    """A mark without a sealed target (a gateway of an older release set it)."""
    session = services.sessions.resolve(
        "main", transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1"
    ).session
    services.sessions.mark_resumable("main", session.session_id)
    message = pb.Message(role=pb.ROLE_USER, content="hello", sender="u1")
    services.sessions.post_to_inbox("main", session.session_id, message)
    gateway = node_gateways("old.jsonl", replyKey=REPLY_KEY)
    gateway.call("start")
    gateway.stop()
    assert sends(tmp_path / "old.jsonl") == [] and list(services.ledger.list()) == []
    assert _resumable(services) == []
    assert "its session holds hashed ids" in gateway.log()


def test_a_node_gateway_without_a_reply_key_does_not_start_for_a_redacting_agent(
    services: Services, node_gateways: Callable[..., NodeGateway]
) -> None:
    gateway = node_gateways()
    with pytest.raises(AssertionError, match="redacts PII: give the gateway a reply key"):
        gateway.call("start")
    assert list(services.ledger.list_instances()) == []
    placeholder = node_gateways("placeholder.jsonl", replyKey="CHANGE-ME")
    assert placeholder.process.wait(timeout=30) != 0
    assert "ReplyKeyRefused" in placeholder.log()
