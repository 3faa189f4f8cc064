"""PII redaction with the server's key: the digests, the key's checks at start-up,
idempotency, keyed request fingerprints, and what redaction costs an append."""

from __future__ import annotations

import hashlib
import hmac
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from session_service.pii import (
    MIN_KEY_BYTES,
    UNKEYED_WARNING,
    PiiKeyRefused,
    Redactor,
    read_key,
)
from switchboard.mutations import fingerprint
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard.shared_settings import SettingsDisagree
from tests.harness import EventLoopThread, ServerProcess, session_server
from tests.pg_faults import private_database
from tests.session.conftest import append, create_agent, resolve
from tests.status import error_reason
from tests.tcp_proxy import ReplyCounter, TcpProxy

KEY = b"another test key of 32 bytes ..."
REDACTS = pb.AgentSettings(redact_pii=True)
DM: dict[str, Any] = {
    "transport": "telegram",
    "chat_type": pb.CHAT_TYPE_DM,
    "chat_id": "7012345678",
}


def _hmac12(value: str, key: bytes = KEY) -> str:
    return hmac.new(key, value.encode(), hashlib.sha256).hexdigest()[:12]


def _sha12(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def _sender(text: str, sender: str) -> pb.SessionEventInput:
    message = pb.Message(role=pb.ROLE_USER, content=text, sender=sender)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


# -- the digests --------------------------------------------------------------------------


def test_keyed_digests_keep_the_shapes_and_differ_from_unkeyed_ones() -> None:
    keyed, unkeyed = Redactor(KEY), Redactor()
    assert keyed.user("u-8399172635") == f"user_{_hmac12('u-8399172635')}"
    assert keyed.chat("telegram", "-1001987654321") == f"telegram:{_hmac12('-1001987654321')}"
    assert unkeyed.user("u-8399172635") == f"user_{_sha12('u-8399172635')}"
    assert keyed.user("u-8399172635") != unkeyed.user("u-8399172635")
    assert Redactor(b"k" * MIN_KEY_BYTES).user("42") != keyed.user("42"), "the key matters"
    assert KEY.decode() not in repr(keyed), "the key never shows in a log line"


def test_redaction_is_idempotent_and_keeps_empty_ids_and_agents() -> None:
    redactor = Redactor(KEY)
    user, chat = redactor.user("u-1"), redactor.chat("slack", "C1")
    assert redactor.user(user) == user
    assert redactor.chat("slack", chat) == chat
    assert redactor.sender(user) == user
    assert redactor.chat("discord", chat) != chat, "another platform's shape is an id there"
    assert redactor.user("") == redactor.chat("slack", "") == redactor.sender("") == ""
    assert redactor.sender("agent:planner") == "agent:planner", "names an agent, not a person"
    assert redactor.sender("u-1") == user


# -- the key ------------------------------------------------------------------------------


def test_keys_shorter_than_16_bytes_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PiiKeyRefused, match="15 bytes long; it must be at least 16"):
        Redactor(b"k" * 15)
    short = tmp_path / "short"
    short.write_bytes(b"k" * 15 + b"\n")
    with pytest.raises(PiiKeyRefused, match="at least 16"):
        read_key(short, None)
    with pytest.raises(PiiKeyRefused, match="at least 16"):
        read_key(None, "")


def test_keys_come_from_a_file_or_the_environment_once(tmp_path: Path) -> None:
    file = tmp_path / "key"
    file.write_bytes(KEY + b"\r\n")
    assert read_key(file, None) == KEY, "a trailing newline is not part of the key"
    assert read_key(None, KEY.decode()) == KEY
    assert read_key(None, None) is None
    with pytest.raises(PiiKeyRefused, match="not both"):
        read_key(file, KEY.decode())
    with pytest.raises(PiiKeyRefused, match="cannot read the PII key file"):
        read_key(tmp_path / "missing", None)


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return subprocess.run(
        [sys.executable, "-m", "switchboard_cli", "--log-format", "text", "serve", "session",
         "--session-listen", "127.0.0.1:0", "--data-dir", str(tmp_path), *args],
        capture_output=True, text=True, timeout=60, check=False,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
    )  # fmt: skip


def test_serve_refuses_a_short_key_and_a_key_on_the_command_line(tmp_path: Path) -> None:
    short = _serve(tmp_path, env={"SWITCHBOARD_PII_KEY": "too-short"})
    assert short.returncode == 2
    assert "9 bytes long; it must be at least 16" in short.stderr
    assert "too-short" not in short.stderr, "the key itself is never printed"
    typed = _serve(tmp_path, "--pii-key", KEY.decode())
    assert typed.returncode == 2 and "never on the command line" in typed.stderr
    assert not (tmp_path / "session.sqlite3").exists(), "refused before opening anything"


def test_serve_lists_both_ways_of_giving_the_key(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "switchboard_cli", "serve", "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    flat = " ".join(shown.split())
    assert "--pii-key-file" in flat and "SWITCHBOARD_PII_KEY_FILE" in flat
    assert "SWITCHBOARD_PII_KEY to the key itself" in flat


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "key"])
def test_start_up_warns_once_when_redaction_has_no_key(tmp_path: Path, keyed: bool) -> None:
    env = {"SWITCHBOARD_PII_KEY": KEY.decode()} if keyed else None
    server = ServerProcess(
        f"sqlite:///{tmp_path / 's.sqlite3'}", tmp_path, service="session", env=env
    )
    server.start()
    server.terminate()
    said = "".join(server.output)
    assert said.count(UNKEYED_WARNING) == (0 if keyed else 1), said


# -- stored and read ----------------------------------------------------------------------


def test_setting_a_key_starts_fresh_sessions_for_redacted_routes(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with session_server(loop_thread, database_url) as before:
        create_agent(before.stub, settings=REDACTS)
        unkeyed = resolve(before.stub, **DM).session
        assert unkeyed.source.chat_id == f"telegram:{_sha12('7012345678')}", "as before keys"
    with session_server(loop_thread, database_url) as restarted:
        assert resolve(restarted.stub, **DM).session.session_id == unkeyed.session_id
    # Replicas must hash alike: a new key is stored only when the operator says so.
    with pytest.raises(SettingsDisagree, match=r"session\.pii_key_id"):
        session_server(loop_thread, database_url, pii_key=KEY)
    with session_server(
        loop_thread, database_url, pii_key=KEY, on_settings_mismatch="overwrite"
    ) as keyed:
        fresh = resolve(keyed.stub, **DM)
        assert fresh.created and fresh.session.session_id != unkeyed.session_id
        assert fresh.session.source.chat_id == f"telegram:{_hmac12('7012345678')}"


def test_senders_are_hashed_only_for_agents_that_redact(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with session_server(loop_thread, database_url, pii_key=KEY) as service:
        create_agent(service.stub, "private", settings=REDACTS)
        create_agent(service.stub, "open")
        hashed = f"user_{_hmac12('u-1')}"
        senders = ["u-1", hashed, "agent:planner", "", f"user_{_sha12('u-1')}"]
        for agent, expected in (
            ("private", [hashed, hashed, "agent:planner", "", f"user_{_sha12('u-1')}"]),
            ("open", senders),
        ):
            session_id = resolve(service.stub, agent, **DM).session.session_id
            events = [_sender(str(n), sender) for n, sender in enumerate(senders)]
            answered = append(service.stub, session_id, *events, agent=agent).events
            assert [e.message_appended.message.sender for e in answered] == expected
            history = service.stub.GetHistory(
                pb.GetHistoryRequest(agent=agent, session_id=session_id)
            ).messages
            assert [q.message.sender for q in history] == expected


def test_request_fingerprints_are_keyed_and_retries_still_replay(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with session_server(loop_thread, database_url, pii_key=KEY) as service:
        create_agent(service.stub, settings=REDACTS)
        request = pb.ResolveSessionRequest(
            agent="main", source=pb.Source(**DM, user_id="u-8399172635"), request_id="r-1"
        )
        first = service.stub.ResolveSession(request)
        assert service.stub.ResolveSession(request) == first, "the retry is replayed"
        other = pb.ResolveSessionRequest(agent="main", source=pb.Source(**DM), request_id="r-1")
        with pytest.raises(grpc.RpcError) as reused:
            service.stub.ResolveSession(other)
        assert error_reason(reused.value) == "REQUEST_ID_REUSED"
        database: Any = service.unit.store.database
        with database.connection_context():
            (stored,) = database.execute_sql(
                "SELECT fingerprint FROM session_request_record"
            ).fetchone()
        assert stored != fingerprint(request), "an unkeyed digest of a short id is guessable"
        assert stored == fingerprint(request, Redactor(KEY).fingerprint_key())


# -- the cost -----------------------------------------------------------------------------


@pytest.mark.postgres
def test_an_append_reads_the_agent_only_for_a_raw_sender(loop_thread: EventLoopThread) -> None:
    """Round trips per append, counted at a proxy: without a sender, or with one stored
    redacted before (a turn's inbox moving to its history), as many as before; with a
    person's raw id for an agent that redacts, two more (reading the agent's state:
    its latest active snapshot, the active events after it)."""
    replies = ReplyCounter()
    with private_database() as db, TcpProxy(("127.0.0.1", 5432)) as proxy:
        proxy.on_reply = replies
        url = db.url.replace("127.0.0.1:5432", proxy.address)
        with session_server(loop_thread, url, pii_key=KEY, health_probe_interval_s=3600.0) as s:
            stub: pb_grpc.SessionServiceStub = s.stub
            create_agent(stub, settings=REDACTS)
            session_id = resolve(stub, **DM).session.session_id

            def per_append(sender: str) -> float:
                append(stub, session_id, _sender("warm-up", sender))
                return replies.per_call(
                    10, lambda n: append(stub, session_id, _sender(f"m{n}", sender))
                )

            plain = per_append("")
            already = per_append(f"user_{_hmac12('u-1')}")
            raw = per_append("u-8399172635")
    print(f"round trips per append: no sender {plain}, redacted {already}, raw {raw}")
    assert plain <= 4.5
    assert already == plain
    assert 1.5 <= raw - plain <= 2.5
