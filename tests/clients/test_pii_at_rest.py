"""No raw personal ids at rest: traffic as the reference gateway (with a reply key)
sends it, a turn cut off and resumed, a failed send recovered by a claim, plus the
direct calls that carry messages (a peer send into an agent that does not redact
among them), then a scan of everything BOTH services stored (each SQLite file and
its WAL byte for byte; every row of every table of each Postgres schema, text and
hex) for every raw chat, thread and user id the traffic used."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import Gateway, Inbound, Turn
from switchboard_client.loopback import LoopbackPlatform

from delivery_service.state_machine import LedgerLimits
from session_service.core import SessionLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import (
    EventLoopThread,
    InProcessSession,
    delivery_server,
    postgres_schema,
    session_server,
)

KEY = b"test-only pii key, 32 bytes long"
REPLY_KEY = "5b0c6f1e9a2d4c3b8e7f6a5d4c3b2a19f0e1d2c3b4a5968778695a4b3c2d1e0f"
# Telegram-like: numeric user and chat ids (a supergroup's is negative), as gateways send them.
DM_USER, GROUP_USER, DIRECT_USER, PEER_USER, HELPER_USER = (
    "u-8399172635", "u-5550001234", "u-4440009999", "u-3330007777", "u-2220005555",
)  # fmt: skip
DM_CHAT, GROUP_CHAT, PEER_CHAT, HELPER_CHAT = (
    "7012345678", "-1001987654321", "6098765432", "5087654321",
)  # fmt: skip
# Forum topics of the group (the gateway's) and of the peer send into the helper agent.
TOPIC, HELPER_THREAD = "8840017585", "9930026646"
RAW_IDS = [
    DM_USER, GROUP_USER, DIRECT_USER, PEER_USER, HELPER_USER,
    DM_CHAT, GROUP_CHAT, PEER_CHAT, HELPER_CHAT, TOPIC, HELPER_THREAD,
]  # fmt: skip
# Their digits alone too: a leak that dropped the prefix or the sign is still a leak.
NEEDLES = sorted({*RAW_IDS, *(i.removeprefix("u-").lstrip("-") for i in RAW_IDS)})
#: Text the traffic stored on purpose: the scan must find it, or it scans nothing.
CONTROL = "the weather in Lisbon"


def keyed(user_id: str) -> str:
    return "user_" + hmac.new(KEY, user_id.encode(), hashlib.sha256).hexdigest()[:12]


def unkeyed(user_id: str) -> str:
    return "user_" + hashlib.sha256(user_id.encode()).hexdigest()[:12]


@dataclass
class Deployment:
    session: InProcessSession
    sessions: SessionClient
    ledger: DeliveryClient
    session_url: str
    ledger_url: str

    @property
    def stub(self) -> pb_grpc.SessionServiceStub:
        return self.session.stub


@pytest.fixture
def deployment(
    database_url: str, loop_thread: EventLoopThread, tmp_path: Path
) -> Iterator[Deployment]:
    """Both services with the PII key, the SessionService snapshotting every few events,
    the ledger in a database of its own (each is scanned on its own); a failed send is
    due again 0.2 s later."""
    with ExitStack() as stack:
        ledger_url = (
            f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
            if database_url.startswith("sqlite")
            else stack.enter_context(postgres_schema())
        )
        limits = SessionLimits(snapshot_every=3, watch_poll_s=0.2)
        session = stack.enter_context(
            session_server(loop_thread, database_url, limits, pii_key=KEY)
        )
        delivery = stack.enter_context(
            delivery_server(loop_thread, ledger_url, LedgerLimits(backoff_s=(0.2,)), pii_key=KEY)
        )
        sessions = stack.enter_context(SessionClient(session.address))
        ledger = stack.enter_context(DeliveryClient(delivery.address))
        settings = pb.AgentSettings(redact_pii=True)
        sessions.create_agent("main", settings=settings, peers=["helper", "vault"])
        sessions.create_agent("helper")  # does not redact: main's messages to it still are
        sessions.create_agent("vault", settings=settings)
        yield Deployment(session, sessions, ledger, database_url, ledger_url)


def _echo(turn: Turn) -> str:
    return f"noted: {turn.state.state.inbox[-1].message.content}"


class TelegramLike(LoopbackPlatform):
    """Platform message ids as Telegram's adapter gives them: `<chat id>:<message id>`."""

    def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        super().send(chat_id, thread_id, text, idempotency_key)
        return f"{chat_id}:{len(self.sent)}"


def _ref(chat_id: str, message_id: int) -> str:
    """An inbound message ref as Telegram's adapter makes it."""
    return f"{chat_id}:{message_id}"


class CutOff(Exception):
    """The gateway died while the model was thinking."""


def _cut_off(turn: Turn) -> str:
    raise CutOff


def _gateway(deployment: Deployment, platform: LoopbackPlatform, agent: Any) -> Gateway:
    return Gateway(
        "tg-bot", "main", deployment.sessions, deployment.ledger, [platform], agent,
        heartbeat_s=0.2, claim_every_s=3600, reply_key=REPLY_KEY,
    )  # fmt: skip


def _recovered_send(gateway: Gateway, platform: LoopbackPlatform, inbound: Inbound) -> None:
    """A send that fails (the row is FAILED, its target sealed) and is then claimed
    and redelivered."""
    platform.mode = "fail"
    gateway.handle(inbound)
    platform.mode = "ok"
    ledger = gateway.ledger
    [row] = [r for r in ledger.list() if r.state == dpb.OBLIGATION_STATE_FAILED]
    while ledger.get(row.id).state != dpb.OBLIGATION_STATE_DELIVERED:
        gateway.recover()


def _gateway_traffic(deployment: Deployment) -> dict[str, str]:
    """Three conversations through the reference gateway (one turn of the topic cut off
    and resumed by the next gateway; one reply of the group recovered by a claim);
    returns their session ids."""
    platform = TelegramLike(name="telegram")
    gateway = _gateway(deployment, platform, _echo)
    dm = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_DM, chat_id=DM_CHAT, user_id=DM_USER
    )
    group = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_GROUP, chat_id=GROUP_CHAT,
        user_id=GROUP_USER,
    )  # fmt: skip
    topic = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_GROUP, chat_id=GROUP_CHAT,
        thread_id=TOPIC, user_id=GROUP_USER,
    )  # fmt: skip
    gateway.start()
    try:
        gateway.handle(Inbound(dm, f"what is {CONTROL}?", message_ref=_ref(DM_CHAT, 901)))
        gateway.handle(Inbound(dm, "and tomorrow?", message_ref=_ref(DM_CHAT, 902)))
        gateway.handle(Inbound(group, "hello group", message_ref=_ref(GROUP_CHAT, 77)))
        again = Inbound(group, "again, group", message_ref=_ref(GROUP_CHAT, 78))
        _recovered_send(gateway, platform, again)
    finally:
        gateway.stop()
    cut_off = _gateway(deployment, LoopbackPlatform(name="telegram"), _cut_off)
    cut_off.start()
    with pytest.raises(CutOff):
        cut_off.handle(Inbound(topic, "in the topic", message_ref=_ref(GROUP_CHAT, 79)))
    cut_off.stop()
    resuming = _gateway(deployment, platform, _echo)
    resuming.start()  # resumes the topic's turn from its sealed target
    resuming.stop()
    assert {(s.chat_id, s.thread_id) for s in platform.sent} == {
        (DM_CHAT, ""), (GROUP_CHAT, ""), (GROUP_CHAT, TOPIC),
    }, "replies reach the raw chats"  # fmt: skip
    assert len(platform.sent) == 5
    ids = {}
    for name, source in (("dm", dm), ("group", group), ("topic", topic)):
        ids[name] = deployment.stub.ResolveSession(
            pb.ResolveSessionRequest(agent="main", source=source)
        ).session.session_id
    return ids


def _message(text: str, sender: str, role: Any = pb.ROLE_USER) -> pb.Message:
    return pb.Message(role=role, content=text, sender=sender, message_ref=_ref(PEER_CHAT, 5))


def _direct_traffic(deployment: Deployment, ids: dict[str, str]) -> None:
    """Every other call that stores a message, each with a request id (so request
    records are written too), and a fork and a snapshot of what they stored."""
    stub, dm = deployment.stub, ids["dm"]

    def rid() -> str:
        return uuid.uuid4().hex

    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="main", session_id=dm, request_id=rid(),
            events=[
                pb.SessionEventInput(
                    message_appended=pb.MessageAppended(message=_message("direct", DIRECT_USER))
                ),
                pb.SessionEventInput(
                    outbox_queued=pb.OutboxQueued(
                        message=_message("queued", DIRECT_USER, pb.ROLE_ASSISTANT)
                    )
                ),
            ],
        )
    )  # fmt: skip
    stub.PostToInbox(
        pb.PostToInboxRequest(
            agent="main", session_id=dm, message=_message("posted", DIRECT_USER),
            request_id=rid(),
        )
    )  # fmt: skip
    stub.Delegate(
        pb.DelegateRequest(
            agent="main", session_id=dm, to_agent="helper", context="research",
            task=_message("look it up", DM_USER), request_id=rid(),
        )
    )  # fmt: skip
    peer_chat = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_DM, chat_id=PEER_CHAT, user_id=PEER_USER
    )
    stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="main", session_id=dm, to_agent="vault", source=peer_chat,
            message=_message("for the vault", PEER_USER), request_id=rid(),
        )
    )  # fmt: skip
    stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="main", session_id=dm, to_agent="helper",
            source=pb.Source(transport="peer", conversation_id="main:chat"),
            message=_message("for the helper", GROUP_USER), request_id=rid(),
        )
    )  # fmt: skip
    # Into an agent that does not redact, routed by a person's chat: main redacts.
    helper_chat = pb.Source(
        transport="telegram", chat_type=pb.CHAT_TYPE_GROUP, chat_id=HELPER_CHAT,
        thread_id=HELPER_THREAD, user_id=HELPER_USER,
    )  # fmt: skip
    stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="main", session_id=dm, to_agent="helper", source=helper_chat,
            message=_message("about that chat", HELPER_USER), request_id=rid(),
        )
    )  # fmt: skip
    stub.ForkSession(pb.ForkSessionRequest(agent="main", session_id=ids["group"], request_id=rid()))
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=dm, request_id=rid()))


def _found_in_sqlite(url: str) -> dict[str, list[str]]:
    """Needles (and the control text) found in the raw bytes of the file and its WAL,
    read while the service still has them open (before any checkpoint at close)."""
    path = Path(url.removeprefix("sqlite:///"))
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 0, "the WAL holds the latest commits"
    found: dict[str, list[str]] = {}
    for file in (path, wal):
        data = file.read_bytes()
        for needle in [*NEEDLES, CONTROL]:
            if needle.encode() in data:
                found.setdefault(needle, []).append(file.name)
    return found


def _found_in_postgres(url: str, expected_table: str) -> dict[str, list[str]]:
    """Needles (and the control text) found in any row of any table of the schema: in
    the row's text (bytea shows as hex there) and in each bytea column's hex."""
    found: dict[str, list[str]] = {}
    connection = psycopg2.connect(url)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()"
            )
            tables = [name for (name,) in cursor.fetchall()]
            assert expected_table in tables, tables
            for table in tables:
                cursor.execute(
                    "SELECT column_name FROM information_schema.columns WHERE "
                    "table_schema = current_schema() AND table_name = %s AND data_type = 'bytea'",
                    (table,),
                )
                hexed = [f", encode(t.\"{column}\", 'hex')" for (column,) in cursor.fetchall()]
                cursor.execute(f'SELECT t::text{"".join(hexed)} FROM "{table}" t')
                for row in cursor.fetchall():
                    dumped = " ".join(str(value) for value in row).lower()
                    for needle in [*NEEDLES, CONTROL]:
                        if needle.lower() in dumped or needle.encode().hex() in dumped:
                            found.setdefault(needle, []).append(table)
    finally:
        connection.close()
    return found


@pytest.mark.parametrize(
    ("service", "table"), [("session", "session_log"), ("ledger", "ledger_obligation")]
)
def test_no_raw_id_the_traffic_used_is_stored(
    deployment: Deployment, service: str, table: str
) -> None:
    ids = _gateway_traffic(deployment)
    _direct_traffic(deployment, ids)
    url = deployment.session_url if service == "session" else deployment.ledger_url
    found = _found_in_sqlite(url) if url.startswith("sqlite") else _found_in_postgres(url, table)
    assert CONTROL in found, "the scan did not see the stored messages"
    assert {needle: where for needle, where in found.items() if needle != CONTROL} == {}


def test_reads_return_the_keyed_digests(deployment: Deployment) -> None:
    ids = _gateway_traffic(deployment)
    _direct_traffic(deployment, ids)
    stub = deployment.stub
    state = stub.GetSessionState(pb.GetSessionStateRequest(agent="main", session_id=ids["dm"]))
    assert state.state.session.source.user_id == keyed(DM_USER)
    assert state.state.session.source.chat_id == "telegram:" + keyed(DM_CHAT)[5:]
    assert [q.message.sender for q in state.state.inbox] == [keyed(DIRECT_USER)]
    assert [q.message.sender for q in state.state.outbox] == [keyed(DIRECT_USER)]
    history = stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=ids["dm"])).messages
    assert [(q.message.content, q.message.sender) for q in history] == [
        (f"what is {CONTROL}?", keyed(DM_USER)),
        ("noted: what is the weather in Lisbon?", ""),
        ("and tomorrow?", keyed(DM_USER)),
        ("noted: and tomorrow?", ""),
        ("direct", keyed(DIRECT_USER)),
    ]
    assert keyed(DM_USER) != unkeyed(DM_USER), "without the key the digest cannot be recomputed"
    group = stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=ids["group"]))
    assert {q.message.sender for q in group.messages} == {keyed(GROUP_USER), ""}

    def inbox_senders(agent: str) -> set[str]:
        return {
            queued.message.sender
            for session in stub.ListSessions(pb.ListSessionsRequest(agent=agent)).sessions
            for queued in stub.GetSessionState(
                pb.GetSessionStateRequest(agent=agent, session_id=session.session_id)
            ).state.inbox
        }

    # helper does not redact, but main, which sent them, does.
    assert inbox_senders("helper") == {keyed(DM_USER), keyed(GROUP_USER), keyed(HELPER_USER)}
    routed = [
        session.source
        for session in stub.ListSessions(pb.ListSessionsRequest(agent="helper")).sessions
        if session.source.transport == "telegram"
    ]
    assert [(s.chat_id, s.thread_id, s.user_id) for s in routed] == [
        ("telegram:" + keyed(HELPER_CHAT)[5:], "thread_" + keyed(HELPER_THREAD)[5:],
         keyed(HELPER_USER)),
    ]  # fmt: skip
    [topic] = [stub.GetSession(pb.GetSessionRequest(agent="main", session_id=ids["topic"]))]
    assert topic.session.source.thread_id == "thread_" + keyed(TOPIC)[5:]
    assert not topic.session.resume_pending and not topic.session.reply_target
    assert inbox_senders("vault") == {keyed(PEER_USER)}
    [vault] = stub.ListSessions(pb.ListSessionsRequest(agent="vault")).sessions
    assert vault.source.chat_id == "telegram:" + keyed(PEER_CHAT)[5:]
    assert vault.source.user_id == keyed(PEER_USER)
