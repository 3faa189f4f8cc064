"""An HTTP door into the reference gateway on the loopback platform: what
`switchboard gateway --platform loopback` serves, so that a deployment (the docker
compose file, deploy/compose.yaml) can be tried end to end without a chat platform.

    POST /messages  {"chat_id": "42", "text": "hello", "message_ref": "42:1"}
        One inbound message in a direct chat, one turn of the gateway: answers 200
        {"reply": "..."}, the reply the loopback platform was sent. `message_ref` is
        the platform's id of the message (default: a new one); with the same reply
        it gives the same ledger row, so a repeated POST is not sent twice.
    GET /healthz    200 "ok" (the gateway has booted before the door opens)

Bad input is answered 400 (413 when too large) saying what to fix, before
anything is written; a turn the services refused, 502 with their error; one
whose agent callback raised, 500.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client._core import Inbound
from switchboard_client.errors import SwitchboardError
from switchboard_client.gateway import Gateway

log = logging.getLogger("switchboard_client.loopback_http")

#: A chat message, not a file: larger bodies are refused before they are read.
MAX_BODY_BYTES = 1 << 20


class BadMessage(ValueError):
    """A POST /messages body the door cannot take; the text says what to fix."""


@dataclass(frozen=True)
class InboundPost:
    chat_id: str
    text: str
    message_ref: str


def parse_message(body: bytes) -> InboundPost:
    """The JSON body of POST /messages, checked."""
    try:
        fields = json.loads(body)
    except ValueError as error:
        raise BadMessage(f"the body is not JSON ({error})") from None
    if not isinstance(fields, dict):
        raise BadMessage('send a JSON object: {"chat_id": "42", "text": "hello"}')
    unknown = sorted(set(fields) - {"chat_id", "text", "message_ref"})
    if unknown:
        raise BadMessage(f"unknown field(s) {unknown}: use chat_id, text and message_ref")
    for name in ("chat_id", "text"):
        if not isinstance(fields.get(name), str) or not fields[name].strip():
            raise BadMessage(f"{name} must be a non-empty string")
    message_ref = fields.get("message_ref", f"http-{uuid.uuid4().hex}")
    if not isinstance(message_ref, str) or not message_ref:
        raise BadMessage("message_ref must be a non-empty string when given")
    return InboundPost(fields["chat_id"], fields["text"], message_ref)


class LoopbackDoor(ThreadingHTTPServer):
    """The HTTP server; each request on its own thread (`Gateway.handle` is thread-safe)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], gateway: Gateway, platform: str) -> None:
        super().__init__(address, _Handler)
        self.gateway = gateway
        self.platform = platform

    def turn(self, post: InboundPost) -> str:
        source = pb.Source(
            transport=self.platform,
            chat_type=pb.CHAT_TYPE_DM,
            chat_id=post.chat_id,
            user_id=post.chat_id,  # in a direct chat the chat is the user's
        )
        return self.gateway.handle(Inbound(source, post.text, message_ref=post.message_ref))


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackDoor

    def do_GET(self) -> None:
        if self.path != "/healthz":
            self._answer(HTTPStatus.NOT_FOUND, {"error": "GET /healthz or POST /messages"})
            return
        self._answer(HTTPStatus.OK, "ok")

    def do_POST(self) -> None:
        if self.path != "/messages":
            self._answer(HTTPStatus.NOT_FOUND, {"error": "POST /messages or GET /healthz"})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read
            error = f"the body is {length} bytes; at most {MAX_BODY_BYTES}"
            self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": error})
            return
        try:
            post = parse_message(self.rfile.read(length))
        except BadMessage as bad:
            self._answer(HTTPStatus.BAD_REQUEST, {"error": str(bad)})
            return
        try:
            reply = self.server.turn(post)
        except SwitchboardError as refused:
            error = f"the services refused the turn: {refused.code.name}: {refused.message}"
            self._answer(HTTPStatus.BAD_GATEWAY, {"error": error})
            return
        except Exception as failed:  # the agent's callback: say so rather than drop the call
            log.exception("the turn for chat %s failed", post.chat_id)
            error = f"the turn failed: {type(failed).__name__}: {failed}"
            self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": error})
            return
        self._answer(HTTPStatus.OK, {"reply": reply})

    def _answer(self, status: HTTPStatus, answer: Any) -> None:
        body = (answer if isinstance(answer, str) else json.dumps(answer)).encode()
        self.send_response(status)
        kind = "text/plain" if isinstance(answer, str) else "application/json"
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)


__all__ = ["MAX_BODY_BYTES", "BadMessage", "InboundPost", "LoopbackDoor", "parse_message"]
