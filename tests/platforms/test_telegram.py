"""TelegramAdapter on python-telegram-bot, against the Bot API stand-in and real services.

What the stand-in leaves out of the Bot API is listed in tests/platforms/standins.py;
what the adapter covers, in switchboard_client/platforms/telegram.py.
"""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from switchboard_client.adapters import SendFailed
from switchboard_client.gateway import RECOVERED_MARKER
from switchboard_client.platforms.telegram import TelegramAdapter

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.platforms.conftest import Services, running_gateway, until, wait_until
from tests.platforms.processes import GatewayProcess
from tests.platforms.standins import Failure, Sent, TelegramStandIn, telegram_error

DM_CHAT = 99
FORUM = -1002285219667
TOPIC = 17585


def _adapter(telegram: TelegramStandIn) -> TelegramAdapter:
    return TelegramAdapter(telegram.token, base_url=telegram.base_url, poll_timeout_s=1)


def _dm_history(services: Services) -> list[tuple[int, str]]:
    session = services.sessions.resolve(
        "main", transport="telegram", chat_type=pb.CHAT_TYPE_DM, chat_id=str(DM_CHAT), user_id="99"
    ).session
    messages = services.sessions.history("main", session.session_id, limit=100)
    return [(q.message.role, q.message.content) for q in messages]


def _run_polling(services: Services, telegram: TelegramStandIn, wanted_rows: int) -> None:
    """A gateway polls until the ledger holds `wanted_rows` rows in a final state."""
    adapter = _adapter(telegram)

    def settled() -> bool:
        rows = list(services.ledger.list())
        final = (dpb.OBLIGATION_STATE_DELIVERED, dpb.OBLIGATION_STATE_ABANDONED)
        return len(rows) == wanted_rows and all(row.state in final for row in rows)

    async def scenario() -> None:
        async with running_gateway(services, adapter) as gateway:
            polling = asyncio.create_task(adapter.poll(gateway.handle))
            try:
                await until(lambda: settled(), "the replies to settle")
            finally:
                adapter.stop()
                await polling
        await adapter.close()

    asyncio.run(scenario())


def test_messages_are_answered_in_their_chat_and_topic(
    services: Services, telegram: TelegramStandIn
) -> None:
    telegram.push_message(DM_CHAT, "hello")
    telegram.push_message(FORUM, "in the topic", user_id=7, chat_type="supergroup", topic=TOPIC)
    _run_polling(services, telegram, wanted_rows=2)
    assert sorted((s.chat_id, s.thread_id, s.text) for s in telegram.sent) == [
        (str(FORUM), str(TOPIC), "answer to in the topic"),
        (str(DM_CHAT), "", "answer to hello"),
    ]
    rows = {row.chat_id: row for row in services.ledger.list()}
    assert {row.state for row in rows.values()} == {dpb.OBLIGATION_STATE_DELIVERED}
    assert rows[str(DM_CHAT)].session_key == f"agent:main:telegram:dm:c={DM_CHAT}"
    assert rows[str(FORUM)].session_key == f"agent:main:telegram:group:c={FORUM}:t={TOPIC}"
    sent = {s.chat_id: s for s in telegram.sent}
    assert rows[str(DM_CHAT)].platform_message_id == f"{DM_CHAT}:{sent[str(DM_CHAT)].message_id}"
    assert _dm_history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ]
    assert telegram.pending_updates() == 0


def test_flood_control_is_retried_after_retry_after(
    services: Services, telegram: TelegramStandIn
) -> None:
    telegram.fail_next(telegram_error(429, "Too Many Requests: retry after 1", retry_after=1))
    telegram.push_message(DM_CHAT, "hello")
    _run_polling(services, telegram, wanted_rows=1)
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    first, second = telegram.attempts
    # A lower bound the ledger guarantees (next_attempt_at), not a timing measurement.
    assert second - first >= 0.9, "retried before Telegram's retry_after"
    # The ledger cannot know a 429 sent nothing: the retry carries the marker.
    assert telegram.texts() == [RECOVERED_MARKER + "answer to hello"]


def test_a_blocked_bot_gives_the_reply_up(services: Services, telegram: TelegramStandIn) -> None:
    telegram.fail_next(telegram_error(403, "Forbidden: bot was blocked by the user"))
    telegram.push_message(DM_CHAT, "hello")
    _run_polling(services, telegram, wanted_rows=1)
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_ABANDONED
    assert "bot was blocked by the user" in row.last_error
    assert telegram.sent == [] and len(telegram.attempts) == 1


@pytest.mark.slow
def test_a_gateway_killed_between_send_and_mark_is_redelivered_once_with_the_marker(
    services: Services, telegram: TelegramStandIn
) -> None:
    first = GatewayProcess("telegram", services, telegram.base_url)
    second: GatewayProcess | None = None
    try:

        def kill(_: Sent) -> None:  # Telegram has the message; the mark never happens
            os.kill(first.pid, signal.SIGKILL)

        telegram.on_send = kill
        telegram.push_message(DM_CHAT, "what is 6 x 7?")
        first.wait_killed()
        telegram.on_send = None
        [owed] = list(services.ledger.list())
        assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING
        # Confirmed to Telegram before the turn ran: the next poller does not re-run it.
        assert telegram.pending_updates() == 0

        second = GatewayProcess("telegram", services, telegram.base_url)
        wait_until(
            lambda: services.ledger.get(owed.id).state == dpb.OBLIGATION_STATE_DELIVERED,
            "the redelivery",
        )
        # The history is written after the mark (a turn cut off in between is completed by
        # the next boot): wait for it, or a loaded machine stops the gateway before it.
        wait_until(lambda: len(_dm_history(services)) == 2, "the turn's completion")
        second.terminate()
    finally:
        first.kill_quietly()
        if second is not None:
            second.kill_quietly()
    answer = "answer to what is 6 x 7?"
    assert telegram.texts() == [answer, RECOVERED_MARKER + answer]
    assert _dm_history(services) == [
        (pb.ROLE_USER, "what is 6 x 7?"),
        (pb.ROLE_ASSISTANT, answer),
    ], "the turn was completed once, not re-run"


@pytest.mark.parametrize(
    ("failure", "retryable", "retry_after_s"),
    [
        (telegram_error(429, "Too Many Requests: retry after 7", retry_after=7), True, 7.0),
        (telegram_error(400, "Bad Request: chat not found"), False, None),
        (telegram_error(403, "Forbidden: bot was blocked by the user"), False, None),
        (
            telegram_error(400, "Bad Request: group chat was upgraded", migrate_to_chat_id=-1001),
            False,
            None,
        ),
        (telegram_error(502, "Bad Gateway"), True, None),
        (telegram_error(500, "Internal Server Error"), True, None),
    ],
)
def test_send_errors_map_onto_the_contract(
    telegram: TelegramStandIn, failure: Failure, retryable: bool, retry_after_s: float | None
) -> None:
    telegram.fail_next(failure)
    failed = asyncio.run(_send_failure(_adapter(telegram)))
    assert (failed.retryable, failed.retry_after_s) == (retryable, retry_after_s)


def test_an_unreachable_bot_api_is_retryable(telegram: TelegramStandIn) -> None:
    telegram.stop()  # nothing listens at its address now
    failed = asyncio.run(_send_failure(_adapter(telegram)))
    assert failed.retryable and failed.retry_after_s is None


async def _send_failure(adapter: TelegramAdapter) -> SendFailed:
    with pytest.raises(SendFailed) as failed:
        await adapter.send(str(DM_CHAT), "", "hello", "key-1")
    return failed.value
