"""`switchboard gateway --platform loopback`: the reference gateway as a process,
its inbound messages POSTed over HTTP, against real services (authentication on)
on SQLite and PostgreSQL. Each message is answered, its reply recorded in the
ledger and delivered; bad posts are refused with what to fix and write nothing; a missing
agent is an error unless --create-agent; SIGTERM stops it and frees its rows."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from switchboard_client import DeliveryClient, SessionClient

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from tests.harness import EventLoopThread, delivery_server, session_server

GRANTS = parse_tokens("gw-admin=admin;gw-bot=gateway:loopback-gateway:main")
SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")
#: A hang guard only.
PATIENCE_S = 60.0
_READY = re.compile(r"listening on (http://\S+); ready")


@dataclass
class Services:
    session: str
    delivery: str


@pytest.fixture
def services(database_url: str, loop_thread: EventLoopThread) -> Iterator[Services]:
    with (
        session_server(loop_thread, database_url, auth=GRANTS) as session,
        delivery_server(loop_thread, database_url, auth=GRANTS) as delivery,
    ):
        yield Services(session.address, delivery.address)


def _argv(services: Services, *extra: str) -> list[str]:
    return [
        SWITCHBOARD, "gateway", "--platform", "loopback", "--agent", "main",
        "--listen", "127.0.0.1:0", "--session-address", services.session,
        "--delivery-address", services.delivery, *extra,
    ]  # fmt: skip


def _environment(token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return {**env, "SWITCHBOARD_TOKEN": token}


@dataclass
class Door:
    process: subprocess.Popen[str]
    url: str

    def post(self, body: bytes) -> tuple[int, dict[str, str]]:
        request = urllib.request.Request(
            f"{self.url}/messages", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=PATIENCE_S) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def message(self, **fields: str) -> tuple[int, dict[str, str]]:
        return self.post(json.dumps(fields).encode())

    def stop(self) -> tuple[int, str]:
        self.process.send_signal(signal.SIGTERM)
        output, _ = self.process.communicate(timeout=PATIENCE_S)
        return self.process.returncode, output


@pytest.fixture
def door(services: Services) -> Iterator[Door]:
    process = subprocess.Popen(
        _argv(services, "--create-agent"), env=_environment("gw-admin"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    printed = []
    try:
        for line in process.stdout:
            printed.append(line)
            if ready := _READY.search(line):
                yield Door(process, ready.group(1))
                return
        raise AssertionError(f"the gateway never said it was ready:\n{''.join(printed)}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=PATIENCE_S)


def _owed(services: Services) -> list[dpb.Obligation]:
    with DeliveryClient(services.delivery, token="gw-admin") as ledger:
        return list(ledger.list(platform="loopback"))


def test_each_posted_message_is_answered_recorded_and_delivered(
    services: Services, door: Door
) -> None:
    first = door.message(chat_id="42", text="hello", message_ref="42:1")
    second = door.message(chat_id="42", text="still there?")
    other = door.message(chat_id="7", text="and you?")

    assert first == (200, {"reply": "(echo) hello [0 earlier messages in this conversation]"})
    assert second == (
        200, {"reply": "(echo) still there? [2 earlier messages in this conversation]"}
    )  # fmt: skip
    assert other[0] == 200
    rows = _owed(services)
    assert [(row.chat_id, row.state) for row in rows] == [
        ("42", dpb.OBLIGATION_STATE_DELIVERED),
        ("42", dpb.OBLIGATION_STATE_DELIVERED),
        ("7", dpb.OBLIGATION_STATE_DELIVERED),
    ], "one ledger row per inbound message, each delivered"
    assert rows[0].message_ref == "42:1" and rows[0].content == first[1]["reply"]
    with SessionClient(services.session, token="gw-admin") as sessions:
        (dm,) = [s for s in sessions.list_sessions("main") if s.routing_key.endswith(":c=42")]
        said = [m.message.content for m in sessions.history("main", dm.session_id)]
    assert said == ["hello", first[1]["reply"], "still there?", second[1]["reply"]]

    code, output = door.stop()
    assert code == 0, output
    with DeliveryClient(services.delivery, token="gw-admin") as ledger:
        assert list(ledger.list_instances(live_only=True)) == [], "stopped: deregistered"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"hello", "the body is not JSON"),
        (b'["42", "hello"]', "send a JSON object"),
        (b'{"chat_id": "42"}', "text must be a non-empty string"),
        (b'{"chat_id": "", "text": "hi"}', "chat_id must be a non-empty string"),
        (b'{"chat_id": "42", "text": "hi", "message_ref": 5}', "message_ref must be"),
        (b'{"chat": "42", "text": "hi"}', "unknown field(s) ['chat']"),
    ],
)
def test_a_bad_post_is_refused_with_what_to_fix_and_writes_nothing(
    services: Services, door: Door, body: bytes, says: str
) -> None:
    code, answer = door.post(body)

    assert code == 400 and says in answer["error"], answer
    assert _owed(services) == []
    with SessionClient(services.session, token="gw-admin") as sessions:
        assert list(sessions.list_sessions("main")) == []


def test_a_refused_turn_is_a_bad_gateway_answer_naming_the_code(
    services: Services, door: Door
) -> None:
    with SessionClient(services.session, token="gw-admin") as sessions:
        sessions.delete_agent("main")

    code, answer = door.message(chat_id="42", text="anyone there?")

    assert code == 502, answer
    assert answer["error"].endswith("FAILED_PRECONDITION: agent 'main' is archived"), answer


def test_a_missing_agent_is_an_error_that_names_the_flag(services: Services) -> None:
    done = subprocess.run(
        _argv(services), env=_environment("gw-admin"),
        capture_output=True, text=True, timeout=PATIENCE_S, check=False,
    )  # fmt: skip

    assert done.returncode == 1, done.stdout + done.stderr
    assert "agent 'main' does not exist: pass --create-agent" in done.stderr
    with SessionClient(services.session, token="gw-admin") as sessions:
        assert list(sessions.list_agents()) == []


def test_a_gateway_token_serves_an_agent_an_admin_created(services: Services) -> None:
    with SessionClient(services.session, token="gw-admin") as sessions:
        sessions.create_agent("main")
    process = subprocess.Popen(
        _argv(services), env=_environment("gw-bot"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    try:
        ready = next(filter(None, map(_READY.search, process.stdout)), None)
        assert ready, "the gateway never said it was ready"
        gateway = Door(process, ready.group(1))
        assert gateway.message(chat_id="1", text="hi")[0] == 200
        assert gateway.stop()[0] == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=PATIENCE_S)


def test_an_unusable_listen_address_is_said_before_anything_starts(services: Services) -> None:
    done = subprocess.run(
        [*_argv(services, "--create-agent"), "--listen", "nowhere"],
        env=_environment("gw-admin"), capture_output=True, text=True, timeout=PATIENCE_S,
        check=False,
    )  # fmt: skip

    assert done.returncode == 2 and "use host:port" in done.stderr, done.stderr
    with SessionClient(services.session, token="gw-admin") as sessions:
        assert list(sessions.list_agents()) == [], "--create-agent waited for a usable address"
