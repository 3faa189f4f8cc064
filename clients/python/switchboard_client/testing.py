"""Stand-ins of the Telegram Bot API and the Slack Web/Events API, over real HTTP.

A testing aid: try a platform adapter (`switchboard_client.platforms`) without a
network, a bot token or a Slack workspace. Each stand-in is an HTTP server on
127.0.0.1 (the standard library's, on a thread of its own) speaking the documented
wire format of exactly the calls the adapters use, so an adapter runs unchanged
with its SDK pointed at it (python-telegram-bot's `base_url`, slack_sdk's
`base_url`). It records what the bot sent (`sent`, `texts()`) and answers the next
sends with canned failures on request (`fail_next`)::

    with TelegramStandIn() as telegram:
        adapter = TelegramAdapter(TelegramStandIn.TOKEN, base_url=telegram.base_url)
        telegram.push_message(chat_id=7, text="hello")  # a user writes
        ...
        assert telegram.texts() == ["answer to hello"]

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
blocks, files, multipart bodies), Telegram's per-chat and global rate counting
(ask for a 429 with `fail_next`), webhooks (setWebhook) and Slack's Socket Mode,
url_verification handshakes from Slack's side, and Slack's automatic event
retries (send the retry with `deliver_event(..., retry_num=1)`).

Standard library only, so it ships with the client and needs none of the
platforms' SDKs itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

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
class Answer:
    """An HTTP answer of a stand-in: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class Failure(Answer):
    """A canned answer for the next send instead of success."""


@dataclass
class Request:
    """An HTTP request as a stand-in reads it: path, headers, and the parameters of
    its query string and body (JSON, or a form whose values stay text)."""

    path: str
    headers: Message
    params: dict[str, Any]


class StandIn:
    """What both stand-ins share: a server on a thread of its own, what was sent,
    canned failures, and a hook run when a send arrives (before it is answered).

    `start()` and `stop()` it, or use it as a context manager.
    """

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        #: Every send request that arrived, answered or not (times, for the retry).
        self.attempts: list[float] = []
        self.failures: list[Failure] = []
        #: Called with the accepted message before the answer goes out (e.g. SIGKILL).
        self.on_send: Callable[[Sent], None] | None = None
        # One lock for everything the server threads share; a condition, so that a
        # long poll can wait on it for news.
        self._lock = threading.Condition()
        self._stopping = False
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def answer(self, request: Request) -> Answer:
        """The platform's answer to one request (run on a server thread)."""
        raise NotImplementedError

    def start(self) -> None:
        """Listens on a free port of 127.0.0.1; `url` is where."""
        self._server = _Server(self)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        """Stops listening; waiting long polls answer at once."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def fail_next(self, *failures: Failure) -> None:
        """Answers the next sends with these failures, in order, instead of success."""
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
        """The texts of the messages the platform accepted, in order."""
        with self._lock:
            return [s.text for s in self.sent]


class _Server(ThreadingHTTPServer):
    """One thread per request, so a long poll does not hold up a send."""

    daemon_threads = True

    def __init__(self, standin: StandIn) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.standin = standin

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up before its answer (a long poll stopped) is no error."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self._respond()

    def do_POST(self) -> None:
        self._respond()

    def _respond(self) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        params: dict[str, Any] = dict(parse_qsl(url.query, keep_blank_values=True))
        params.update(_body_params(self.headers.get_content_type(), body))
        answer = self.server.standin.answer(Request(url.path, self.headers, params))
        data = json.dumps(answer.body).encode()
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in answer.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a test's output is not the place for an access log."""


def _body_params(content_type: str, body: bytes) -> dict[str, Any]:
    """A JSON body's fields, or a form's (values JSON-encoded when not strings, as
    python-telegram-bot sends them, are kept as their text)."""
    if not body:
        return {}
    if content_type == "application/json":
        fields: dict[str, Any] = json.loads(body)
        return fields
    return dict(parse_qsl(body.decode(), keep_blank_values=True))


# -- Telegram -------------------------------------------------------------------------------


def telegram_error(status: int, description: str, **parameters: Any) -> Failure:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return Failure(status, body)


class TelegramStandIn(StandIn):
    """The Bot API for one bot token; `base_url` is python-telegram-bot's base_url."""

    TOKEN = "4242:test-token"

    def __init__(self, token: str = TOKEN) -> None:
        super().__init__()
        self.token = token
        self._updates: list[dict[str, Any]] = []
        self._update_ids = itertools.count(1000)
        self._message_ids = itertools.count(1)
        #: The highest offset a getUpdates confirmed with (every update below it is gone).
        self.confirmed_offset = 0

    @property
    def base_url(self) -> str:
        return f"{self.url}/bot"

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
        with self._lock:
            self._updates.append(update)
            self._lock.notify_all()
        return update

    def pending_updates(self) -> int:
        """Updates not confirmed yet (they would be handed out again)."""
        with self._lock:
            return len([u for u in self._updates if u["update_id"] >= self.confirmed_offset])

    def answer(self, request: Request) -> Answer:
        call = re.fullmatch(r"/bot([^/]+)/([^/]+)", request.path)
        if call is None:
            return telegram_error(404, "Not Found")
        token, method = call.groups()
        if token != self.token:
            return telegram_error(401, "Unauthorized")
        if method == "getMe":
            return Answer(200, {"ok": True, "result": BOT_USER})
        if method == "getUpdates":
            return Answer(200, {"ok": True, "result": self._get_updates(request.params)})
        if method == "sendMessage":
            return self._send_message(request.params)
        return telegram_error(404, "Not Found")

    def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(params.get("offset") or 0)
        limit = int(params.get("limit") or 100)
        wait_s = float(params.get("timeout") or 0)
        with self._lock:
            if offset:
                self.confirmed_offset = max(self.confirmed_offset, offset)
                self._updates = [u for u in self._updates if u["update_id"] >= offset]
            self._lock.wait_for(lambda: bool(self._updates) or self._stopping, wait_s)
            return self._updates[:limit]

    def _send_message(self, params: dict[str, Any]) -> Answer:
        if not params.get("chat_id") or not params.get("text"):
            return telegram_error(400, "Bad Request: message text is empty")
        failure = self._next_failure()
        if failure is not None:
            return failure
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
        return Answer(200, {"ok": True, "result": result})


# -- Slack ----------------------------------------------------------------------------------

SLACK_TEAM = "T0000TEAM"
SLACK_BOT_USER = "U0000BOT"


def slack_error(error: str) -> Failure:
    return Failure(200, {"ok": False, "error": error})


def slack_rate_limited(retry_after_s: int) -> Failure:
    return Failure(429, {"ok": False, "error": "ratelimited"}, {"Retry-After": str(retry_after_s)})


class SlackStandIn(StandIn):
    """The Web API for one bot token (`base_url` is slack_sdk's base_url), and the
    sender of signed event callbacks to the app."""

    TOKEN = "xoxb-test"
    SECRET = "signing-secret"

    def __init__(self, token: str = TOKEN, signing_secret: str = SECRET) -> None:
        super().__init__()
        self.token = token
        self.signing_secret = signing_secret
        self._ts = itertools.count(1)
        self._event_ids = itertools.count(1)

    @property
    def base_url(self) -> str:
        return f"{self.url}/api/"

    def answer(self, request: Request) -> Answer:
        call = re.fullmatch(r"/api/([^/]+)", request.path)
        if call is None:
            return Answer(404, {"ok": False, "error": "unknown_method"})
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return Answer(200, {"ok": False, "error": "invalid_auth"})
        method = call.group(1)
        if method == "auth.test":
            return Answer(
                200,
                {
                    "ok": True,
                    "url": "https://switchboard-test.slack.com/",
                    "team": "Switchboard Test",
                    "user": "switchboard",
                    "team_id": SLACK_TEAM,
                    "user_id": SLACK_BOT_USER,
                    "bot_id": "B0000BOT",
                },
            )
        if method == "chat.postMessage":
            return self._post_message(request.params)
        return Answer(404, {"ok": False, "error": "unknown_method"})

    def _post_message(self, params: dict[str, Any]) -> Answer:
        if not params.get("channel"):
            return slack_error("channel_not_found")
        if not params.get("text"):
            return slack_error("no_text")
        failure = self._next_failure()
        if failure is not None:
            return failure
        ts = f"{int(time.time())}.{next(self._ts):06d}"
        thread = str(params.get("thread_ts") or "")
        self._accept(Sent(params["channel"], thread, params["text"], ts, time.monotonic()))
        message = {"type": "message", "text": params["text"], "user": SLACK_BOT_USER, "ts": ts}
        if thread:
            message["thread_ts"] = thread
        return Answer(200, {"ok": True, "channel": params["channel"], "ts": ts, **message})

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
        """POSTs the event to the app as Slack does; returns the HTTP status.

        Raises `ConnectionError` when the app gives no answer (it refused the
        connection, or closed it before answering)."""
        body = json.dumps(payload).encode()
        headers = self.signed_headers(body)
        if retry_num is not None:
            headers.update(
                {"X-Slack-Retry-Num": str(retry_num), "X-Slack-Retry-Reason": "http_timeout"}
            )
        return await asyncio.to_thread(_post, app_url, body, headers)


#: No proxy from the environment: the app listens on this machine.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _post(url: str, body: bytes, headers: Mapping[str, str]) -> int:
    """POSTs `body`; the answer's HTTP status, an error status included."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    try:
        with _DIRECT.open(request, timeout=60) as answer:
            status: int = answer.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except urllib.error.URLError as error:  # refused, unreachable: no answer at all
        raise ConnectionError(f"{url}: {error.reason}") from error
