"""Issue 21 item 2, end to end: an agent that redacts PII, services holding a PII key,
gateway processes (TelegramAdapter on the Bot API stand-in) holding a reply key. A
gateway killed mid-turn, or between the send and the ledger's mark, and the next
gateway answers the raw chat and topic, never a hashed id, while neither service
stores the raw ids."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.gateway import RECOVERED_MARKER
from switchboard_client.testing import Sent, TelegramStandIn

from delivery_service.state_machine import LedgerLimits
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, delivery_server, session_server
from tests.platforms.conftest import Services, wait_until
from tests.platforms.processes import GatewayProcess

pytestmark = pytest.mark.slow

PII_KEY = b"redacting gateway tests, 32 b..."
REPLY = {"SWITCHBOARD_REPLY_KEY": os.urandom(32).hex()}
FORUM, TOPIC, USER = -1002285219667, 17585, 7012345678


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


def _gateway(services: Services, telegram: TelegramStandIn, *flags: str) -> GatewayProcess:
    return GatewayProcess("telegram", services, telegram.base_url, *flags, env=REPLY)


def _push(telegram: TelegramStandIn, text: str) -> None:
    telegram.push_message(FORUM, text, user_id=USER, chat_type="supergroup", topic=TOPIC)


def _session(services: Services) -> pb.Session:
    [session] = services.sessions.list_sessions("main")
    return session


def _no_raw_ids(services: Services) -> None:
    """What the services hand back holds no raw id: the adapter's message refs and
    platform message ids (`<chat id>:<message id>`) included."""
    session = services.sessions.get_session("main", _session(services).session_id)
    stored = [session.source.chat_id, session.source.thread_id, session.source.user_id]
    for entry in services.sessions.list_log_events(agent="main"):  # the whole log
        stored.append(str(entry.event))
    for row in services.ledger.list():
        stored += [row.session_key, row.chat_id, row.thread_id, row.message_ref]
        stored += [row.platform_message_id]
    for raw in (str(FORUM).lstrip("-"), str(TOPIC), str(USER)):
        assert not any(raw in value for value in stored), (raw, stored)


def test_a_turn_cut_off_mid_model_is_resumed_at_the_raw_chat_and_topic(
    services: Services, telegram: TelegramStandIn
) -> None:
    thinking = _gateway(services, telegram, "--hang")
    rescuer: GatewayProcess | None = None
    try:
        _push(telegram, "what is 6 x 7?")

        def mid_turn() -> bool:
            marked = services.sessions.list_resumable("main").sessions
            return bool(marked) and bool(
                services.sessions.state("main", marked[0].session_id).state.inbox
            )

        wait_until(mid_turn, "the turn to be marked and its message stored")
        thinking.process.send_signal(signal.SIGKILL)
        thinking.process.wait(timeout=30)
        [marked] = services.sessions.list_resumable("main").sessions
        assert marked.reply_target and marked.resume_holder
        assert marked.source.chat_id.startswith("telegram:"), "hashed: the bug's reply target"

        rescuer = _gateway(services, telegram)
        # Once the killed gateway's lease has run out, a periodic claim resumes the turn.
        wait_until(lambda: len(telegram.sent) >= 1, "the resumed reply")
        wait_until(lambda: not services.sessions.list_resumable("main").sessions, "the turn end")
        rescuer.terminate()
    finally:
        thinking.kill_quietly()
        if rescuer is not None:
            rescuer.kill_quietly()
    assert [(s.chat_id, s.thread_id, s.text) for s in telegram.sent] == [
        (str(FORUM), str(TOPIC), "answer to what is 6 x 7?")
    ], "the raw chat and topic, never telegram:<digest>"
    [row] = list(services.ledger.list())
    assert (row.state, row.chat_id) == (dpb.OBLIGATION_STATE_DELIVERED, "")
    assert row.sealed_target and row.message_ref.startswith("ref_"), "hashed by the ledger"
    _no_raw_ids(services)


def test_a_reply_cut_off_before_its_mark_is_redelivered_at_the_raw_chat_and_topic(
    services: Services, telegram: TelegramStandIn
) -> None:
    first = _gateway(services, telegram)
    second: GatewayProcess | None = None
    try:

        def kill(_: Sent) -> None:  # Telegram has the message; the mark never happens
            os.kill(first.pid, signal.SIGKILL)

        telegram.on_send = kill
        _push(telegram, "what is 6 x 7?")
        first.wait_killed()
        telegram.on_send = None
        [owed] = list(services.ledger.list())
        assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING
        assert (owed.chat_id, owed.thread_id) == ("", "") and owed.sealed_target

        second = _gateway(services, telegram)
        wait_until(
            lambda: services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED,
            "the redelivery",
        )
        second.terminate()
    finally:
        first.kill_quietly()
        if second is not None:
            second.kill_quietly()
    answer = "answer to what is 6 x 7?"
    assert [(s.chat_id, s.thread_id, s.text) for s in telegram.sent] == [
        (str(FORUM), str(TOPIC), answer),
        (str(FORUM), str(TOPIC), RECOVERED_MARKER + answer),
    ]
    history = services.sessions.history("main", _session(services).session_id)
    assert [q.message.content for q in history] == ["what is 6 x 7?", answer], "finished once"
    _no_raw_ids(services)


def test_a_gateway_without_a_reply_key_does_not_start_for_a_redacting_agent(
    services: Services, telegram: TelegramStandIn
) -> None:
    try:
        started = GatewayProcess(
            "telegram", services, telegram.base_url, env={"SWITCHBOARD_REPLY_KEY": ""}
        )
    except AssertionError as refused:
        assert "redacts PII: give the gateway a reply key" in str(refused)
    else:
        started.kill_quietly()
        pytest.fail("a gateway without a reply key started for a redacting agent")
    assert list(services.ledger.list_instances()) == []
