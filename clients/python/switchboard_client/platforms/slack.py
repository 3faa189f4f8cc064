"""Slack for `AsyncGateway`, on slack_sdk's AsyncWebClient (extra `slack`).

    adapter = SlackAdapter(bot_token, signing_secret)
    gateway = AsyncGateway("my-bot", "main", sessions, ledger, [adapter], agent)
    await gateway.start()                          # connect() calls auth.test
    runner = await adapter.serve_events(gateway.handle, "0.0.0.0", 3000)
    ...                                            # Slack posts events to http://host:3000/
    await runner.cleanup()

What it covers of the Slack API: auth.test (connect), the Events API over HTTP
(signed requests checked with the signing secret, url_verification, the
`message` and `app_mention` events of users; bot messages, edits and other
subtypes are ignored) and chat.postMessage with `thread_ts` (replies in the
thread the message came from). Socket Mode, interactivity, slash commands,
blocks and files are not handled.

Event retries. Slack re-sends an event it got no 2xx for within 3 s
(`X-Slack-Retry-Num`). Each message is keyed by `<channel>:<ts>` (its `ts` is the
same in the `message` and the `app_mention` event of one message, and in every
retry); that key is the reply's `message_ref`, so the ledger keeps one reply
per message. A retry reaching another gateway instance finds the reply recorded
by the first and sends nothing; one reaching this instance finds the turn
running or done and is acknowledged without a second turn. The answer to
Slack waits up to `ack_within_s` for the turn: a turn that failed (the
services unreachable) answers 500 so that Slack tries again; a slow one is
acknowledged and goes on.

Sends. chat.postMessage has no idempotency key and nothing tells afterwards
whether a post went out, so `idempotent_sends` is False and `was_delivered` is
absent: a reply cut off between send and mark is re-sent with the marker.
slack_sdk's own retries are off: a retry is the ledger's, with the marker.
Errors: HTTP 429 is retryable after its Retry-After header; `ok: false` errors
about the channel, the token or the message (channel_not_found, not_in_channel,
invalid_auth, is_archived, msg_too_long, ...) are not; Slack's own failures
(5xx, internal_error, service_unavailable, ...) and network errors are.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

try:
    import aiohttp
    from aiohttp import web
    from slack_sdk.errors import SlackApiError
    from slack_sdk.signature import SignatureVerifier
    from slack_sdk.web.async_client import AsyncWebClient
except ImportError as missing:  # the extra is not installed: say which one
    raise ImportError(
        f"switchboard_client.platforms.slack needs slack_sdk and aiohttp ({missing.name} is "
        "missing): pip install 'switchboard-client[slack]'"
    ) from missing

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.adapters import SendFailed
from switchboard_client.async_gateway import Inbound

log = logging.getLogger("switchboard_client.platforms.slack")

Handler = Callable[[Inbound], Awaitable[object]]

CHAT_TYPES = {
    "im": pb.CHAT_TYPE_DM,
    "mpim": pb.CHAT_TYPE_GROUP,
    "channel": pb.CHAT_TYPE_CHANNEL,
    "group": pb.CHAT_TYPE_CHANNEL,  # a private channel
}
CHANNEL = pb.CHAT_TYPE_CHANNEL
#: `ok: false` errors that are Slack's trouble, not the request's: worth a retry.
RETRYABLE_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
#: Messages answered (or being answered) remembered for event retries, newest kept.
REMEMBERED = 10_000


class SlackAdapter:
    """A Slack app: `events_app` feeds the gateway, `send` answers (see the module docstring)."""

    name = "slack"
    idempotent_sends = False

    def __init__(
        self,
        token: str,
        signing_secret: str,
        *,
        base_url: str = AsyncWebClient.BASE_URL,
        ack_within_s: float = 2.5,
        client: AsyncWebClient | None = None,
    ) -> None:
        """`base_url` as slack_sdk's (ends with "/"). `ack_within_s` stays under
        Slack's 3 s, after which it retries the event."""
        # No SDK retries: a retried post may be a duplicate, which only the marker says.
        self.client = client or AsyncWebClient(token=token, base_url=base_url, retry_handlers=[])
        self.verifier = SignatureVerifier(signing_secret)
        self.ack_within_s = ack_within_s
        self.bot_user_id = ""
        self._turns: OrderedDict[str, asyncio.Future[object]] = OrderedDict()

    async def connect(self) -> None:
        """auth.test: checks the token; learns the bot's user id (its own posts are ignored)."""
        try:
            answer = await self.client.auth_test()
        except SlackApiError as error:
            raise ConnectionError(
                f"slack auth.test failed: {error.response.get('error')}"
            ) from error
        self.bot_user_id = str(answer.get("user_id") or "")

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        """chat.postMessage; returns "<channel>:<ts>". Raises SendFailed."""
        try:
            answer = await self.client.chat_postMessage(
                channel=chat_id, text=text, thread_ts=thread_id or None
            )
        except SlackApiError as error:
            raise send_failed(error) from error
        except (aiohttp.ClientError, TimeoutError) as error:
            raise SendFailed(f"slack network error: {error!r}", retryable=True) from error
        return f"{answer.get('channel', chat_id)}:{answer.get('ts', '')}"

    # -- inbound -----------------------------------------------------------------------

    def inbound(self, payload: dict[str, Any]) -> Inbound | None:
        """The gateway's Inbound for a user's message event; None for anything else."""
        event = payload.get("event") or {}
        if payload.get("type") != "event_callback" or not _from_a_user(event, self.bot_user_id):
            return None
        channel = str(event.get("channel", ""))
        source = pb.Source(
            transport="slack",
            # An app_mention carries no channel_type: it is said in a channel.
            chat_type=CHAT_TYPES.get(str(event.get("channel_type", "channel")), CHANNEL),
            chat_id=channel,
            thread_id=str(event.get("thread_ts", "")),
            user_id=str(event.get("user", "")),
            scope_id=str(payload.get("team_id", "")),
        )
        return Inbound(source, str(event.get("text", "")), message_ref=f"{channel}:{event['ts']}")

    def events_app(self, handle: Handler, path: str = "/") -> web.Application:
        """An aiohttp app taking Slack's event requests at `path`; each user message
        becomes `handle(inbound)` (the gateway's `handle`)."""

        async def on_request(request: web.Request) -> web.StreamResponse:
            return await self._on_request(request, handle)

        app = web.Application()
        app.router.add_post(path, on_request)
        return app

    async def serve_events(
        self, handle: Handler, host: str, port: int, path: str = "/"
    ) -> web.AppRunner:
        """`events_app` listening on host:port; `await runner.cleanup()` stops it."""
        runner = web.AppRunner(self.events_app(handle, path))
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        return runner

    async def _on_request(self, request: web.Request, handle: Handler) -> web.StreamResponse:
        body = await request.read()
        headers = request.headers
        timestamp = headers.get("X-Slack-Request-Timestamp", "")
        if not self.verifier.is_valid(body, timestamp, headers.get("X-Slack-Signature", "")):
            return web.Response(status=401, text="invalid signature")
        try:
            payload = json.loads(body)
        except ValueError:
            return web.Response(status=400, text="not JSON")
        if payload.get("type") == "url_verification":
            return web.json_response({"challenge": payload.get("challenge", "")})
        inbound = self.inbound(payload)
        if inbound is None:
            return web.Response(status=200)
        return await self._answer(inbound, handle, headers.get("X-Slack-Retry-Num"))

    async def _answer(
        self, inbound: Inbound, handle: Handler, retry_num: str | None
    ) -> web.StreamResponse:
        """One turn per message however often Slack sends it; 500 only for a failed turn."""
        key = inbound.message_ref
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = asyncio.ensure_future(handle(inbound))
            while len(self._turns) > REMEMBERED:
                self._turns.popitem(last=False)
        elif retry_num is not None:
            log.info("slack retry %s of %s: the turn is running or done", retry_num, key)
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.ack_within_s)
        except TimeoutError:
            return web.Response(status=200)  # still running: Slack must not send it again
        except Exception:
            log.exception("the turn for slack message %s failed; Slack will retry it", key)
            if self._turns.get(key) is turn:
                del self._turns[key]  # so that Slack's retry runs it again
            return web.Response(status=500)
        return web.Response(status=200)


def _from_a_user(event: dict[str, Any], bot_user_id: str) -> bool:
    """A user's new message: not a bot's (our own replies included), edit or join."""
    if event.get("type") not in ("message", "app_mention") or "ts" not in event:
        return False
    if event.get("subtype") or event.get("bot_id"):
        return False
    return bool(event.get("user")) and event.get("user") != bot_user_id


def send_failed(error: SlackApiError) -> SendFailed:
    """The contract's verdict on a Web API error."""
    response = error.response
    status = response.status_code
    code = str(response.get("error") or "") if isinstance(response.data, dict) else ""
    if status == 429:
        retry_after = response.headers.get("Retry-After") or response.headers.get("retry-after")
        seconds = float(retry_after) if retry_after else None
        return SendFailed(f"slack 429 ({code or 'ratelimited'})", True, seconds)
    if status >= 500 or code in RETRYABLE_ERRORS:
        return SendFailed(f"slack {status}: {code or 'server error'}", retryable=True)
    return SendFailed(f"slack: {code or status}", retryable=False)


__all__ = ["SlackAdapter", "send_failed"]
