"""Stand-ins of the Telegram Bot API and the Slack Web/Events API, over real HTTP.

Each is an aiohttp server on 127.0.0.1 speaking the documented wire format of
exactly the calls the adapters use, so the adapters run unchanged with their
SDK pointed at it (python-telegram-bot's `base_url`, slack_sdk's `base_url`).

Telegram (https://core.telegram.org/bots/api): POST /bot<token>/<method> with
parameters as a query string, form or JSON; answers `{"ok": true, "result": ...}`
or `{"ok": false, "error_code": N, "description": "...", "parameters": {...}}`
with that HTTP status. getMe; getUpdates (long polling: `offset` confirms every
update below it, `timeout` waits for new ones, `limit`); sendMessage (chat_id,
text, message_thread_id).

Slack (https://api.slack.com/web, /apis/events-api): POST /api/<method> with a
Bearer token; HTTP 200 with `{"ok": true, ...}` or `{"ok": false, "error": "..."}`,
and HTTP 429 with a Retry-After header when rate limited. auth.test;
chat.postMessage (channel, text, thread_ts). Events go the other way:
`deliver_event` POSTs an `event_callback` to the app, signed as Slack signs
(v0 HMAC-SHA256 of "v0:<timestamp>:<body>"), with X-Slack-Retry-Num/-Reason on
a retry.

Left out: every other method and parameter (parse modes, keyboards, media,
blocks, files), Telegram's per-chat and global rate counting (a test asks for
a 429), webhooks (setWebhook) and Slack's Socket Mode, url_verification
handshakes from Slack's side, and Slack's automatic event retries (a test sends
the retry).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tests.harness import EventLoopThread

BOT_ID = 4242
BOT_USER = {"id": BOT_ID, "is_bot": True, "first_name": "Switchboard", "username": "sb_test_bot"}


@dataclass
class Sent:
    """A message the platform accepted."""

    chat_id: str
    thread_id: str
    text: str
    message_id: str
    at: float  # time.monotonic() on arrival


@dataclass
class Failure:
    """A canned answer for the next send instead of success."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class StandIn:
    """What both stand-ins share: a server on the loop thread, what was sent, canned
    failures, and a hook run when a send arrives (before it is answered)."""

    def __init__(self, loop: EventLoopThread) -> None:
        self.loop = loop
        self.sent: list[Sent] = []
        #: Every send request that arrived, answered or not (times, for the retry).
        self.attempts: list[float] = []
        self.failures: list[Failure] = []
        #: Called with the accepted message before the answer goes out (e.g. SIGKILL).
        self.on_send: Callable[[Sent], None] | None = None
        self._lock = threading.Lock()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def app(self) -> web.Application:
        raise NotImplementedError

    def start(self) -> None:
        async def start() -> str:
            self._runner = web.AppRunner(self.app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = self._runner.addresses[0][1]
            return f"http://127.0.0.1:{port}"

        self.url = self.loop.run(start())

    def stop(self) -> None:
        if self._runner is not None:
            self.loop.run(self._runner.cleanup())
            self._runner = None

    def fail_next(self, *failures: Failure) -> None:
        with self._lock:
            self.failures.extend(failures)

    def _next_failure(self) -> Failure | None:
        with self._lock:
            self.attempts.append(time.monotonic())
            return self.failures.pop(0) if self.failures else None

    def _accept(self, sent: Sent) -> None:
        with self._lock:
            self.sent.append(sent)
        if self.on_send is not None:
            self.on_send(sent)

    def texts(self) -> list[str]:
        with self._lock:
            return [s.text for s in self.sent]


# -- Telegram -------------------------------------------------------------------------------


def telegram_error(status: int, description: str, **parameters: Any) -> Failure:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return Failure(status, body)


class TelegramStandIn(StandIn):
    """The Bot API for one bot token; `url` + "/bot" is python-telegram-bot's base_url."""

    TOKEN = "4242:test-token"

    def __init__(self, loop: EventLoopThread, token: str = TOKEN) -> None:
        super().__init__(loop)
        self.token = token
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        self._new_update: asyncio.Event | None = None
        #: The highest offset a getUpdates confirmed with (every update below it is gone).
        self.confirmed_offset = 0

    @property
    def base_url(self) -> str:
        return f"{self.url}/bot"

    def app(self) -> web.Application:
        self._new_update = asyncio.Event()
        app = web.Application()
        app.router.add_post("/bot{token}/{method}", self._call)
        app.router.add_get("/bot{token}/{method}", self._call)
        return app

    def push_message(
        self,
        chat_id: int,
        text: str,
        *,
        user_id: int | None = None,
        chat_type: str = "private",
        topic: int | None = None,
    ) -> dict[str, Any]:
        """A user writes: an update waits for the bot's getUpdates. Thread-safe."""
        user = {"id": user_id or chat_id, "is_bot": False, "first_name": "Ada"}
        message: dict[str, Any] = {
            "message_id": next(self._message_ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": chat_type, **({"is_forum": True} if topic else {})},
            "from": user,
            "text": text,
        }
        if topic is not None:
            message.update(message_thread_id=topic, is_topic_message=True)
        update = {"update_id": next(self._update_ids), "message": message}

        def add() -> None:
            self._updates.append(update)
            assert self._new_update is not None
            self._new_update.set()

        self.loop.loop.call_soon_threadsafe(add)
        return update

    def pending_updates(self) -> int:
        """Updates not confirmed yet (they would be handed out again)."""
        return len([u for u in list(self._updates) if u["update_id"] >= self.confirmed_offset])

    async def _call(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _telegram_answer(telegram_error(401, "Unauthorized"))
        params = await _telegram_params(request)
        method = request.match_info["method"]
        if method == "getMe":
            return web.json_response({"ok": True, "result": BOT_USER})
        if method == "getUpdates":
            return web.json_response({"ok": True, "result": await self._get_updates(params)})
        if method == "sendMessage":
            return self._send_message(params)
        return _telegram_answer(telegram_error(404, "Not Found"))

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(params.get("offset") or 0)
        if offset:
            self.confirmed_offset = max(self.confirmed_offset, offset)
            self._updates = [u for u in self._updates if u["update_id"] >= offset]
        deadline = time.monotonic() + float(params.get("timeout") or 0)
        assert self._new_update is not None
        while not self._updates and time.monotonic() < deadline:
            self._new_update.clear()
            try:
                await asyncio.wait_for(self._new_update.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        limit = int(params.get("limit") or 100)
        return self._updates[:limit]

    def _send_message(self, params: dict[str, Any]) -> web.Response:
        if not params.get("chat_id") or not params.get("text"):
            return _telegram_answer(telegram_error(400, "Bad Request: message text is empty"))
        failure = self._next_failure()
        if failure is not None:
            return _telegram_answer(failure)
        chat_id = int(params["chat_id"])
        message_id = next(self._message_ids)
        thread = params.get("message_thread_id")
        result: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": BOT_USER,
            "text": params["text"],
        }
        if thread:
            result.update(message_thread_id=int(thread), is_topic_message=True)
        sent = Sent(str(chat_id), str(thread or ""), params["text"], str(message_id), 0.0)
        sent.at = time.monotonic()
        self._accept(sent)
        return web.json_response({"ok": True, "result": result})


async def _telegram_params(request: web.Request) -> dict[str, Any]:
    """The Bot API takes a query string, a form (values JSON-encoded when not strings,
    as python-telegram-bot sends them) or a JSON body."""
    params: dict[str, Any] = dict(request.query)
    if request.content_type == "application/json":
        params.update(await request.json())
    elif request.can_read_body:
        params.update({key: str(value) for key, value in (await request.post()).items()})
    return params


def _telegram_answer(failure: Failure) -> web.Response:
    return web.json_response(failure.body, status=failure.status, headers=failure.headers)


# -- Slack ----------------------------------------------------------------------------------

SLACK_TEAM = "T0000TEAM"
SLACK_BOT_USER = "U0000BOT"


def slack_error(error: str) -> Failure:
    return Failure(200, {"ok": False, "error": error})


def slack_rate_limited(retry_after_s: int) -> Failure:
    return Failure(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after_s)})


class SlackStandIn(StandIn):
    """The Web API for one bot token (`url` + "/api/" is slack_sdk's base_url), and the
    sender of signed event callbacks to the app."""

    TOKEN = "xoxb-test"
    SECRET = "signing-secret"

    def __init__(
        self, loop: EventLoopThread, token: str = TOKEN, signing_secret: str = SECRET
    ) -> None:
        super().__init__(loop)
        self.token = token
        self.signing_secret = signing_secret
        self._ts = itertools.count(1)
        self._event_ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/api/"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/api/{method}", self._call)
        return app

    async def _call(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        method = request.match_info["method"]
        if method == "auth.test":
            return web.json_response(
                {
                    "ok": True,
                    "url": "https://switchboard-test.slack.com/",
                    "team": "Switchboard Test",
                    "user": "switchboard",
                    "team_id": SLACK_TEAM,
                    "user_id": SLACK_BOT_USER,
                    "bot_id": "B0000BOT",
                }
            )
        if method == "chat.postMessage":
            return self._post_message(await _slack_params(request))
        return web.json_response({"ok": False, "error": "unknown_method"}, status=404)

    def _post_message(self, params: dict[str, Any]) -> web.Response:
        if not params.get("channel"):
            return web.json_response({"ok": False, "error": "channel_not_found"})
        if not params.get("text"):
            return web.json_response({"ok": False, "error": "no_text"})
        failure = self._next_failure()
        if failure is not None:
            return web.json_response(failure.body, status=failure.status, headers=failure.headers)
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        thread = str(params.get("thread_ts") or "")
        self._accept(Sent(params["channel"], thread, params["text"], ts, time.monotonic()))
        message = {"type": "message", "text": params["text"], "user": SLACK_BOT_USER, "ts": ts}
        if thread:
            message["thread_ts"] = thread
        return web.json_response({"ok": True, "channel": params["channel"], "ts": ts, **message})

    # -- the Events API, towards the app --------------------------------------------------

    def message_event(
        self,
        channel: str,
        text: str,
        *,
        user: str = "U0000ADA",
        channel_type: str = "im",
        thread_ts: str = "",
    ) -> dict[str, Any]:
        """An event_callback for a user's message (as Slack wraps it)."""
        number = next(self._event_ids)
        event: dict[str, Any] = {
            "type": "message",
            "channel": channel,
            "channel_type": channel_type,
            "user": user,
            "text": text,
            "ts": f"{int(time.time())}.{number:06d}",
            "client_msg_id": f"00000000-0000-0000-0000-{number:012d}",
            "team": SLACK_TEAM,
        }
        if thread_ts:
            event["thread_ts"] = thread_ts
        return {
            "token": "verification-token",
            "team_id": SLACK_TEAM,
            "api_app_id": "A0000APP",
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{number:08d}",
            "event_time": int(time.time()),
        }

    def signed_headers(self, body: bytes) -> dict[str, str]:
        """Slack's request signing: v0 HMAC-SHA256 of "v0:<timestamp>:<body>"."""
        timestamp = str(int(time.time()))
        base = f"v0:{timestamp}:".encode() + body
        digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()
        return {
            "Content-Type": "application/json",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": f"v0={digest}",
        }

    async def deliver_event(
        self, app_url: str, payload: dict[str, Any], retry_num: int | None = None
    ) -> int:
        """POSTs the event to the app as Slack does; returns the HTTP status."""
        body = json.dumps(payload).encode()
        headers = self.signed_headers(body)
        if retry_num is not None:
            headers.update(
                {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"}
            )
        async with (
            aiohttp.ClientSession() as client,
            client.post(app_url, data=body, headers=headers) as answer,
        ):
            return answer.status


async def _slack_params(request: web.Request) -> dict[str, Any]:
    """Web API methods take JSON (slack_sdk's chat.postMessage) or a form."""
    if request.content_type == "application/json":
        body: dict[str, Any] = await request.json()
        return body
    return {key: str(value) for key, value in (await request.post()).items()}
