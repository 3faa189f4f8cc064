"""The reference gateways end to end: real services, the loopback platform.

Each test of a gateway runs on both: the threaded `Gateway` and `AsyncGateway`
(grpc.aio clients, async platform calls; tests/clients/gateway_drivers.py).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import RECOVERED_MARKER, Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform
from switchboard_client.transports import CronJob, CronTransport

from delivery_service.state_machine import LedgerLimits
from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.clients.gateway_drivers import KINDS, AnyGateway, make_gateway
from tests.harness import EventLoopThread, delivery_server, session_server

ROOT = Path(__file__).resolve().parents[2]
DM = pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1")


@dataclass
class Services:
    sessions: SessionClient
    ledger: DeliveryClient
    session_address: str
    delivery_address: str
    #: Which gateway the test runs on: "threaded" or "async".
    kind: str


#: Runs a test on both gateways (it overrides the `kind` fixture).
both = pytest.mark.parametrize("kind", KINDS)


@pytest.fixture
def kind() -> str:
    """The threaded gateway, for tests of what only it drives (the transports)."""
    return "threaded"


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread, kind: str) -> Iterator[Services]:
    # A killed gateway is dead within a second; a failed send is retried 0.2 s later.
    limits = LedgerLimits(lease_ttl_s=1.0, backoff_s=(0.2,))
    with (
        session_server(loop_thread, database_url) as session,
        delivery_server(loop_thread, database_url, limits) as delivery,
        SessionClient(session.address) as sessions,
        DeliveryClient(delivery.address) as ledger,
    ):
        sessions.create_agent("main")
        yield Services(sessions, ledger, session.address, delivery.address, kind)


def echo(turn: Turn) -> str:
    return f"answer to {turn.state.state.inbox[-1].message.content}"


def _gateway(services: Services, platform: Any) -> AnyGateway:
    return make_gateway(
        services.kind,
        "test-gateway",
        "main",
        (services.session_address, services.delivery_address),
        [platform],
        echo,
        clients=(services.sessions, services.ledger),
        heartbeat_s=0.2,
        claim_every_s=3600,
    )


def _history(services: Services) -> list[tuple[int, str]]:
    session = services.sessions.resolve(
        "main", transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id="chat-1", user_id="u1"
    ).session
    messages = services.sessions.history("main", session.session_id, limit=100)
    return [(q.message.role, q.message.content) for q in messages]


@both
def test_a_full_conversation(services: Services) -> None:
    platform = LoopbackPlatform()
    gateway = _gateway(services, platform)
    gateway.start()
    try:
        assert gateway.handle(Inbound(DM, "hello", message_ref="m-1")) == "answer to hello"
        gateway.handle(Inbound(DM, "again", message_ref="m-2"))
    finally:
        gateway.stop()
    assert [s.text for s in platform.sent] == ["answer to hello", "answer to again"]
    assert _history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
        (pb.ROLE_USER, "again"),
        (pb.ROLE_ASSISTANT, "answer to again"),
    ]
    rows = list(services.ledger.list())
    assert [row.state for row in rows] == [dpb.OBLIGATION_STATE_DELIVERED] * 2
    assert list(services.sessions.list_resumable("main").sessions) == []


def _crash_mid_send(services: Services, *flags: str) -> dpb.Obligation:
    """A gateway process of the test's kind dies in its platform send (SIGKILL)."""
    command = [
        sys.executable,
        "-m",
        "tests.clients.gateway_process",
        services.session_address,
        services.delivery_address,
        *flags,
        *(["--async"] if services.kind == "async" else []),
    ]
    crashed = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert crashed.returncode == -9, crashed.stderr
    [owed] = list(services.ledger.list())
    assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING
    return owed


def _recover(services: Services, platform: LoopbackPlatform) -> None:
    rescuer = _gateway(services, platform)
    rescuer.start()  # the crashed instance's lease (1 s) runs out while this one boots
    try:
        deadline = time.monotonic() + 30
        while not platform.sent:
            assert time.monotonic() < deadline, "nothing was redelivered"
            rescuer.recover()
            time.sleep(0.1)
    finally:
        rescuer.stop()


@both
def test_a_gateway_killed_mid_send_is_recovered_with_the_marker(services: Services) -> None:
    owed = _crash_mid_send(services)
    platform = LoopbackPlatform()
    _recover(services, platform)
    assert [s.text for s in platform.sent] == [RECOVERED_MARKER + "answer to what is 6 x 7?"]
    assert services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED
    assert _history(services) == [
        (pb.ROLE_USER, "what is 6 x 7?"),
        (pb.ROLE_ASSISTANT, "answer to what is 6 x 7?"),
    ], "the turn was completed, not re-run"
    assert list(services.sessions.list_resumable("main").sessions) == []


@both
def test_an_idempotent_platform_gets_the_recovered_reply_without_marker(
    services: Services,
) -> None:
    owed = _crash_mid_send(services, "--idempotent")
    platform = LoopbackPlatform(idempotent_sends=True)
    _recover(services, platform)
    assert [(s.text, s.key) for s in platform.sent] == [("answer to what is 6 x 7?", owed.id)]
    assert services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED


@both
def test_periodic_claims_retry_a_failed_send(services: Services) -> None:
    platform = LoopbackPlatform(mode="fail")
    gateway = _gateway(services, platform)
    gateway.claim_every_s = 0.2
    gateway.start()
    try:
        gateway.handle(Inbound(DM, "hello", message_ref="m-1"))  # fails; retry due in 0.2 s
        platform.mode = "ok"
        deadline = time.monotonic() + 30
        while not platform.sent:
            assert time.monotonic() < deadline, "the periodic claim did not retry"
            time.sleep(0.05)
    finally:
        gateway.stop()
    assert [s.text for s in platform.sent] == [RECOVERED_MARKER + "answer to hello"]
    assert _history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ], "the turn ended with its reply once; the retried send adds nothing to it"


@both
def test_a_stop_lets_the_periodic_claim_under_way_deliver_and_complete_its_turn(
    services: Services,
) -> None:
    """A graceful stop during a periodic claim's redelivery waits for it: the reply goes
    out, its row is DELIVERED and its turn completed (cut in between, the reply would
    reach the chat with its turn left open)."""
    platform = LoopbackPlatform(mode="fail")
    gateway = _gateway(services, platform)
    gateway.claim_every_s = 0.2
    gateway.start()
    gateway.handle(Inbound(DM, "hello", message_ref="m-1"))  # fails; retry due in 0.2 s
    [owed] = list(services.ledger.list())
    platform.mode = "hang"  # the retry's send waits for `release`
    deadline = time.monotonic() + 30
    # The failed send left the row waiting for its retry; the claim takes it again.
    while services.ledger.get(owed.id).state != dpb.OBLIGATION_STATE_ATTEMPTING:
        assert time.monotonic() < deadline, "the periodic claim did not retry"
        time.sleep(0.05)
    stopping = threading.Thread(target=gateway.stop)
    stopping.start()
    time.sleep(0.5)  # the stop is under way while the send hangs
    platform.mode = "ok"
    platform.release.set()
    stopping.join(timeout=30)
    assert not stopping.is_alive()
    assert [s.text for s in platform.sent] == [RECOVERED_MARKER + "answer to hello"]
    assert services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED
    assert _history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ], "the redelivered reply completed its turn before the gateway stopped"


@both
def test_a_platform_down_during_recovery_keeps_its_budget(services: Services) -> None:
    first = _gateway(services, LoopbackPlatform(mode="fail"))
    first.start()
    first.handle(Inbound(DM, "hello", message_ref="m-1"))  # the send fails (retryable)
    first.stop()
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_FAILED

    class Offline(LoopbackPlatform):
        def connect(self) -> None:
            raise ConnectionError("the platform is down")

    platform = Offline()
    second = _gateway(services, platform)
    second.start()
    try:
        services.ledger.retry(row.id)  # due now, so only the platform gate holds it back
        for _ in range(3):
            assert second.recover() == 0
        assert services.ledger.get(row.id).attempts == 0, "no attempt spent while down"
        second.reconnected(platform.name)
    finally:
        second.stop()
    assert [s.text for s in platform.sent] == [RECOVERED_MARKER + "answer to hello"]
    assert services.ledger.get(row.id).state == dpb.OBLIGATION_STATE_DELIVERED


def test_the_repl_transport(services: Services) -> None:
    chat = subprocess.run(
        [
            sys.executable, "-m", "switchboard_cli", "chat", "--agent", "main",
            "--session-address", services.session_address,
            "--delivery-address", services.delivery_address,
        ],
        input="hello\nagain\n/new\nfresh start\n/quit\n",
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert chat.returncode == 0, chat.stderr
    replies = [line for line in chat.stdout.splitlines() if line.startswith("agent> ")]
    assert replies == [
        "agent> (echo) hello [0 earlier messages in this conversation]",
        "agent> (echo) again [2 earlier messages in this conversation]",
        "agent> (echo) fresh start [0 earlier messages in this conversation]",
    ]
    sessions = list(services.sessions.list_sessions("main", transport="repl"))
    assert [s.status for s in sessions] == [pb.SESSION_STATUS_OPEN, pb.SESSION_STATUS_ENDED]


def test_the_cron_transport_routes_each_job_to_its_own_session(services: Services) -> None:
    platform = LoopbackPlatform()
    gateway = Gateway(
        "test-gateway", "main", services.sessions, services.ledger, [platform], echo,
        heartbeat_s=0.2, claim_every_s=3600,
    )  # fmt: skip
    gateway.start()
    jobs = [
        CronJob("digest", 0.1, "daily digest", "loopback", "ops-channel"),
        CronJob("backup", 3600, "backup report", "loopback", "ops-channel"),
    ]
    cron = CronTransport(gateway, jobs)
    try:
        cron.start()
        deadline = time.monotonic() + 30
        while len(platform.sent) < 2:
            assert time.monotonic() < deadline, "the digest job did not fire twice"
            time.sleep(0.05)
        cron.stop()
        cron.fire(jobs[1], 1)
    finally:
        gateway.stop()
    assert {s.chat_id for s in platform.sent} == {"ops-channel"}
    keys = {s.routing_key for s in services.sessions.list_sessions("main", transport="cron")}
    assert keys == {"agent:main:cron:id=digest", "agent:main:cron:id=backup"}


@both
def test_a_platform_that_can_tell_is_asked_instead_of_resending(services: Services) -> None:
    owed = _crash_mid_send(services)

    class Remembering(LoopbackPlatform):
        """This platform can look a send up by its key: the first send did arrive."""

        def was_delivered(self, idempotency_key: str) -> str | None:
            return "platform-msg-7" if idempotency_key == owed.id else None

    platform = Remembering()
    rescuer = _gateway(services, platform)
    rescuer.start()
    try:
        deadline = time.monotonic() + 30
        while services.ledger.get(owed.id).state != dpb.OBLIGATION_STATE_DELIVERED:
            assert time.monotonic() < deadline, "the row was never settled"
            rescuer.recover()
            time.sleep(0.1)
    finally:
        rescuer.stop()
    assert platform.sent == [], "no duplicate went out"
    assert services.ledger.get(owed.id).platform_message_id == "platform-msg-7"
    assert list(services.sessions.list_resumable("main").sessions) == [], "the turn is finished"


@both
def test_two_bots_with_their_own_tokens_each_recover_only_their_own_replies(
    database_url: str, loop_thread: EventLoopThread, kind: str
) -> None:
    """Issue 12: two bots on one platform, each with its gateway token. A failed
    reply is redelivered by a new process of the bot that owes it, never the other."""
    grants = parse_tokens("root=admin;tg=gateway:tgbot:main;mb=gateway:mainbot:main")
    # Nothing here waits for a lease to run out (failed rows are due after the backoff):
    # a long lease keeps a loaded machine's late heartbeat from ending a live instance.
    limits = LedgerLimits(lease_ttl_s=5.0, backoff_s=(0.2,))
    chats = {"tgbot": ("tg", "chat-tg"), "mainbot": ("mb", "chat-mb")}
    with (
        session_server(loop_thread, database_url, auth=grants) as session,
        delivery_server(loop_thread, database_url, limits, auth=grants) as delivery,
        SessionClient(session.address, token="root") as admin_sessions,
        DeliveryClient(delivery.address, token="root") as admin_ledger,
    ):
        admin_sessions.create_agent("main")

        def bot(name: str, platform: LoopbackPlatform) -> AnyGateway:
            return make_gateway(
                kind, name, "main", (session.address, delivery.address), [platform], echo,
                token=chats[name][0], heartbeat_s=0.2, claim_every_s=3600,
            )  # fmt: skip

        for name, (_, chat) in chats.items():
            failing = bot(name, LoopbackPlatform(mode="fail"))
            failing.start()
            source = pb.Source(transport="loopback", chat_type=pb.CHAT_TYPE_DM, chat_id=chat)
            failing.handle(Inbound(source, f"hello {name}", message_ref="m-1"))
            failing.stop()
        rows = {row.gateway_name: row for row in admin_ledger.list()}
        assert {name: row.state for name, row in rows.items()} == {
            "tgbot": dpb.OBLIGATION_STATE_FAILED,
            "mainbot": dpb.OBLIGATION_STATE_FAILED,
        }
        for name, (_, chat) in reversed(chats.items()):
            platform = LoopbackPlatform()
            restarted = bot(name, platform)
            restarted.start()
            try:
                deadline = time.monotonic() + 30
                while admin_ledger.get(rows[name].id).state != dpb.OBLIGATION_STATE_DELIVERED:
                    assert time.monotonic() < deadline, f"{name} did not redeliver its reply"
                    restarted.recover()
                    time.sleep(0.05)
                restarted.recover()  # nothing of the other bot's, even when due
            finally:
                restarted.stop()
            assert [(s.chat_id, s.text) for s in platform.sent] == [
                (chat, RECOVERED_MARKER + f"answer to hello {name}")
            ]
        assert {admin_ledger.get(row.id).state for row in rows.values()} == {
            dpb.OBLIGATION_STATE_DELIVERED
        }
