"""SlackAdapter on slack_sdk's AsyncWebClient, against the Web/Events API stand-in and
real services.

What the stand-in leaves out of Slack's APIs is listed in switchboard_client.testing;
what the adapter covers, in switchboard_client/platforms/slack.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from switchboard_client.adapters import SendFailed
from switchboard_client.async_gateway import Turn
from switchboard_client.gateway import RECOVERED_MARKER
from switchboard_client.platforms.slack import SlackAdapter
from switchboard_client.testing import (
    SLACK_TEAM,
    Failure,
    Sent,
    SlackStandIn,
    slack_error,
    slack_rate_limited,
)

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from tests.platforms.conftest import Services, echo, running_gateway, until, wait_until
from tests.platforms.processes import GatewayProcess

DM = "D0000DM01"
CHANNEL = "C0000GEN1"
FINAL = (dpb.OBLIGATION_STATE_DELIVERED, dpb.OBLIGATION_STATE_ABANDONED)


def _adapter(slack: SlackStandIn, **options: Any) -> SlackAdapter:
    return SlackAdapter(slack.token, slack.signing_secret, base_url=slack.base_url, **options)


@asynccontextmanager
async def _serving(
    services: Services, adapter: SlackAdapter, agent: Callable[[Turn], Any] = echo
) -> AsyncIterator[str]:
    """A gateway with the adapter, its events endpoint listening; yields the endpoint."""
    async with running_gateway(services, adapter, agent) as gateway:
        runner = await adapter.serve_events(gateway.handle, "127.0.0.1", 0)
        try:
            yield f"http://127.0.0.1:{runner.addresses[0][1]}/"
        finally:
            await runner.cleanup()


def _settled(services: Services, rows: int) -> Callable[[], bool]:
    def check() -> bool:
        listed = list(services.ledger.list())
        return len(listed) == rows and all(row.state in FINAL for row in listed)

    return check


def _dm_history(services: Services) -> list[tuple[int, str]]:
    session = services.sessions.resolve(
        "main",
        transport="slack",
        chat_type=pb.CHAT_TYPE_DM,
        chat_id=DM,
        user_id="U0000ADA",
        scope_id=SLACK_TEAM,
    ).session
    messages = services.sessions.history("main", session.session_id, limit=100)
    return [(q.message.role, q.message.content) for q in messages]


def test_events_are_answered_in_their_channel_and_thread(
    services: Services, slack: SlackStandIn
) -> None:
    in_dm = slack.message_event(DM, "hello")
    in_thread = slack.message_event(
        CHANNEL, "in the thread", channel_type="channel", thread_ts="1700000000.000001"
    )

    async def scenario() -> None:
        async with _serving(services, _adapter(slack)) as url:
            assert await slack.deliver_event(url, in_dm) == 200
            assert await slack.deliver_event(url, in_thread) == 200
            await until(_settled(services, 2), "both replies")

    asyncio.run(scenario())
    assert sorted((s.chat_id, s.thread_id, s.text) for s in slack.sent) == [
        (CHANNEL, "1700000000.000001", "answer to in the thread"),
        (DM, "", "answer to hello"),
    ]
    rows = {row.chat_id: row for row in services.ledger.list()}
    assert {row.state for row in rows.values()} == {dpb.OBLIGATION_STATE_DELIVERED}
    sent = {s.chat_id: s for s in slack.sent}
    assert rows[DM].platform_message_id == f"{DM}:{sent[DM].message_id}"
    assert rows[CHANNEL].thread_id == "1700000000.000001"
    assert _dm_history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ]


def test_unsigned_bot_and_edit_events_write_nothing(
    services: Services, slack: SlackStandIn
) -> None:
    from_a_bot = slack.message_event(DM, "a bot speaks")
    from_a_bot["event"]["bot_id"] = "B0000OTHER"
    an_edit = slack.message_event(DM, "edited")
    an_edit["event"]["subtype"] = "message_changed"
    forged = SlackStandIn(signing_secret="not-the-secret")

    async def scenario() -> None:
        async with _serving(services, _adapter(slack)) as url:
            assert await forged.deliver_event(url, slack.message_event(DM, "forged")) == 401
            assert await slack.deliver_event(url, from_a_bot) == 200
            assert await slack.deliver_event(url, an_edit) == 200
            body = json.dumps({"type": "url_verification", "challenge": "c-1", "token": "t"})
            headers = slack.signed_headers(body.encode())
            async with (
                aiohttp.ClientSession() as client,
                client.post(url, data=body, headers=headers) as answer,
            ):
                assert (answer.status, await answer.json()) == (200, {"challenge": "c-1"})

    asyncio.run(scenario())
    assert slack.sent == []
    assert list(services.ledger.list()) == []
    assert list(services.sessions.list_sessions("main")) == []


def test_rate_limiting_is_retried_after_retry_after(
    services: Services, slack: SlackStandIn
) -> None:
    slack.fail_next(slack_rate_limited(1))

    async def scenario() -> None:
        async with _serving(services, _adapter(slack)) as url:
            assert await slack.deliver_event(url, slack.message_event(DM, "hello")) == 200
            await until(_settled(services, 1), "the retried reply")

    asyncio.run(scenario())
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED
    first, second = slack.attempts
    # A lower bound the ledger guarantees (next_attempt_at), not a timing measurement.
    assert second - first >= 0.9, "retried before Slack's Retry-After"
    assert slack.texts() == [RECOVERED_MARKER + "answer to hello"]


def test_a_channel_the_bot_is_not_in_gives_the_reply_up(
    services: Services, slack: SlackStandIn
) -> None:
    slack.fail_next(slack_error("not_in_channel"))

    async def scenario() -> None:
        async with _serving(services, _adapter(slack)) as url:
            event = slack.message_event(CHANNEL, "hello", channel_type="channel")
            assert await slack.deliver_event(url, event) == 200
            await until(_settled(services, 1), "the given-up reply")

    asyncio.run(scenario())
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_ABANDONED
    assert "not_in_channel" in row.last_error
    assert slack.sent == [] and len(slack.attempts) == 1


def test_a_retried_event_is_answered_once(services: Services, slack: SlackStandIn) -> None:
    """Slack re-sends an event it got no answer for in 3 s: to the same instance while
    the turn runs and after it ended, and to another instance of the bot."""
    event = slack.message_event(DM, "hello")
    release = asyncio.Event()
    turns: list[str] = []

    async def slow(turn: Turn) -> str:
        turns.append(turn.state.state.inbox[-1].message.content)
        await release.wait()
        return await echo(turn)

    async def scenario() -> None:
        async with _serving(services, _adapter(slack, ack_within_s=0.1), slow) as url:
            assert await slack.deliver_event(url, event) == 200  # acknowledged, still running
            assert await slack.deliver_event(url, event, retry_num=1) == 200
            release.set()
            await until(_settled(services, 1), "the reply")
            assert await slack.deliver_event(url, event, retry_num=2) == 200
            async with _serving(services, _adapter(slack)) as other_instance:
                assert await slack.deliver_event(other_instance, event, retry_num=3) == 200

    asyncio.run(scenario())
    assert turns == ["hello"], "one turn on the instance that got the event first"
    assert slack.texts() == ["answer to hello"]
    [row] = list(services.ledger.list())
    assert row.state == dpb.OBLIGATION_STATE_DELIVERED


def test_a_failed_turn_answers_500_and_slacks_retry_runs_it(
    services: Services, slack: SlackStandIn
) -> None:
    event = slack.message_event(DM, "hello")
    calls: list[int] = []

    async def flaky(turn: Turn) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the model is down")
        return await echo(turn)

    async def scenario() -> None:
        async with _serving(services, _adapter(slack), flaky) as url:
            assert await slack.deliver_event(url, event) == 500
            assert await slack.deliver_event(url, event, retry_num=1) == 200
            await until(_settled(services, 1), "the reply")

    asyncio.run(scenario())
    assert slack.texts() == ["answer to hello"]


@pytest.mark.slow
def test_a_gateway_killed_between_send_and_mark_is_redelivered_once_with_the_marker(
    services: Services, slack: SlackStandIn
) -> None:
    """Slack got the post, the gateway died before the mark: Slack (no 2xx) retries the
    event to the next gateway process, which redelivers the owed reply once."""
    first = GatewayProcess("slack", services, slack.base_url)
    second: GatewayProcess | None = None
    event = slack.message_event(DM, "what is 6 x 7?")
    try:

        def kill(_: Sent) -> None:
            os.kill(first.pid, signal.SIGKILL)

        slack.on_send = kill
        with pytest.raises(ConnectionError):  # the process died under the request
            asyncio.run(slack.deliver_event(first.events_url, event))
        first.wait_killed()
        slack.on_send = None
        [owed] = list(services.ledger.list())
        assert owed.state == dpb.OBLIGATION_STATE_ATTEMPTING

        second = GatewayProcess("slack", services, slack.base_url)
        delivered = dpb.OBLIGATION_STATE_DELIVERED
        wait_until(lambda: services.ledger.get(owed.id).state == delivered, "the redelivery")
        # Slack's retry of the event reaches the instance that redelivered the reply.
        assert asyncio.run(slack.deliver_event(second.events_url, event, retry_num=1)) == 200
        second.terminate()
    finally:
        first.kill_quietly()
        if second is not None:
            second.kill_quietly()
    answer = "answer to what is 6 x 7?"
    assert slack.texts() == [answer, RECOVERED_MARKER + answer]


def _one_turn_answered(services: Services) -> bool:
    resumable = services.sessions.list_resumable("main").sessions
    return _settled(services, 1)() and not resumable


@pytest.mark.slow
def test_one_event_given_to_two_gateway_processes_runs_one_turn(
    services: Services, slack: SlackStandIn, tmp_path: Path
) -> None:
    """Slack got no answer from the first process within 3 s (its agent thinks) and
    retries; the retry reaches a second process of the bot: no second turn."""
    turns, release = tmp_path / "turns", tmp_path / "release"
    flags = (f"--log-turns={turns}", f"--hold-until={release}")
    first = GatewayProcess("slack", services, slack.base_url, *flags)
    second = GatewayProcess("slack", services, slack.base_url, *flags)
    event = slack.message_event(DM, "hello")
    try:
        # Acknowledged after the adapter's 2.5 s, the turn still running.
        assert asyncio.run(slack.deliver_event(first.events_url, event)) == 200
        wait_until(turns.exists, "the first process's turn")
        assert asyncio.run(slack.deliver_event(second.events_url, event, retry_num=1)) == 200
        release.touch()
        wait_until(lambda: _one_turn_answered(services), "the reply")
        first.terminate()
        second.terminate()
    finally:
        first.kill_quietly()
        second.kill_quietly()
    assert turns.read_text().splitlines() == [f"{first.pid} hello"]
    assert slack.texts() == ["answer to hello"]
    assert _dm_history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ]


@pytest.mark.slow
def test_an_event_whose_process_died_mid_turn_is_resumed_once_by_the_process_slack_retries_to(
    services: Services, slack: SlackStandIn, tmp_path: Path
) -> None:
    """The first process dies while its agent thinks (no 2xx: Slack retries). The retry
    reaches a second process, booted before: its post is a duplicate, and the turn is
    the dead process's. It is not dropped: resumed once the dead one's lease ran out."""
    turns = tmp_path / "turns"
    second = GatewayProcess("slack", services, slack.base_url, f"--log-turns={turns}")
    first = GatewayProcess(
        "slack", services, slack.base_url, f"--log-turns={turns}", "--die-in-agent"
    )
    event = slack.message_event(DM, "hello")
    try:
        with pytest.raises(ConnectionError):  # the process died under the request
            asyncio.run(slack.deliver_event(first.events_url, event))
        first.wait_killed()
        assert asyncio.run(slack.deliver_event(second.events_url, event, retry_num=1)) == 200
        wait_until(lambda: _one_turn_answered(services), "the resumed turn")
        second.terminate()
    finally:
        first.kill_quietly()
        second.kill_quietly()
    assert turns.read_text().splitlines() == [f"{first.pid} hello", f"{second.pid} hello"]
    assert slack.texts() == ["answer to hello"]
    assert _dm_history(services) == [
        (pb.ROLE_USER, "hello"),
        (pb.ROLE_ASSISTANT, "answer to hello"),
    ]


@pytest.mark.parametrize(
    ("failure", "retryable", "retry_after_s"),
    [
        (slack_rate_limited(7), True, 7.0),
        (slack_error("channel_not_found"), False, None),
        (slack_error("not_in_channel"), False, None),
        (slack_error("invalid_auth"), False, None),
        (slack_error("msg_too_long"), False, None),
        (slack_error("internal_error"), True, None),
        (Failure(503, {"ok": False, "error": "service_unavailable"}), True, None),
        (Failure(502, {}), True, None),
    ],
)
def test_send_errors_map_onto_the_contract(
    slack: SlackStandIn, failure: Failure, retryable: bool, retry_after_s: float | None
) -> None:
    slack.fail_next(failure)
    failed = asyncio.run(_send_failure(_adapter(slack)))
    assert (failed.retryable, failed.retry_after_s) == (retryable, retry_after_s)


def test_a_revoked_token_is_not_retryable(slack: SlackStandIn) -> None:
    adapter = SlackAdapter("xoxb-revoked", slack.signing_secret, base_url=slack.base_url)
    failed = asyncio.run(_send_failure(adapter))
    assert not failed.retryable and "invalid_auth" in str(failed)


def test_an_unreachable_slack_is_retryable(slack: SlackStandIn) -> None:
    slack.stop()  # nothing listens at its address now
    failed = asyncio.run(_send_failure(_adapter(slack)))
    assert failed.retryable and failed.retry_after_s is None


async def _send_failure(adapter: SlackAdapter) -> SendFailed:
    with pytest.raises(SendFailed) as failed:
        await adapter.send(DM, "", "hello", "key-1")
    return failed.value
