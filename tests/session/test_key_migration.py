"""The upgrade to injective routing keys (issue 21 item 1), on a database written by the
release that had the colliding keys (89c0bf6, tests/fixtures/routing-keys), on both
backends: every conversation keeps its session, the sessions two conversations shared
are reported, and a rebuild, rewind or checkout across the upgrade keeps the new keys
(the log's format-1 rows are read upgraded; the log itself is never rewritten)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from session_service import key_migration, recovery, storage_format
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.upgrade import key_fixture, key_sample

ROOT = Path(__file__).resolve().parents[2]
WRITTEN = key_fixture.written()
CONVERSATIONS: dict[str, Any] = WRITTEN["conversations"]
NAMED: dict[str, str] = WRITTEN["sessions"]
#: Every old key of the fixture and the key it has now (read off by hand: ids escaped,
#: each in its own place; a peer thread's sender from its "<agent>:" prefix).
NEW_KEYS = {
    "agent:plain:telegram:dm:a:b": "agent:plain:telegram:dm:c=a%3Ab",
    "agent:plain:telegram:group:-100123:4242": "agent:plain:telegram:group:c=-100123:u=4242",
    "agent:plain:telegram:group:-100999:77": "agent:plain:telegram:group:c=-100999:t=77",
    "agent:plain:matrix:group:!room:example.org:@alice:example.org":
        "agent:plain:matrix:group:c=!room%3Aexample.org:u=@alice%3Aexample.org",
    "agent:plain:matrix:dm:!dm:example.org": "agent:plain:matrix:dm:c=!dm%3Aexample.org",
    "agent:plain:slack:dm:T1:D1": "agent:plain:slack:dm:s=T1:c=D1",
    "agent:plain:discord:group:g:u": "agent:plain:discord:group:c=g:u=u",
    "agent:plain:web:tab-1": "agent:plain:web:id=tab-1",
    "agent:plain:telegram:dm:12345": "agent:plain:telegram:dm:c=12345",
    "agent:plain:slack:channel:T9:C9:171.001": "agent:plain:slack:channel:s=T9:c=C9:t=171.001",
    "agent:plain:cron:job:nightly": "agent:plain:cron:id=job%3Anightly",
    "agent:private:telegram:dm:telegram:91a73fd806ab":
        "agent:private:telegram:dm:c=telegram%3A91a73fd806ab",
    "agent:private:telegram:group:telegram:9c83dedcb375:user_5e968ce47ce4":
        "agent:private:telegram:group:c=telegram%3A9c83dedcb375:u=user_5e968ce47ce4",
    "agent:private:telegram:group:telegram:109b035303de:17585":
        "agent:private:telegram:group:c=telegram%3A109b035303de:t=17585",
    "agent:private:slack:dm:T1:slack:1f355930beb5:171.002":
        "agent:private:slack:dm:s=T1:c=slack%3A1f355930beb5:t=171.002",
    "agent:plain:telegram:dm:x:y": "agent:plain:telegram:dm:c=x%3Ay",
    "agent:planner:web:plan": "agent:planner:web:id=plan",
    "agent:mallory:web:plot": "agent:mallory:web:id=plot",
    "agent:coder:peer:planner:ticket-7": "agent:coder:peer:from=planner:id=planner%3Aticket-7",
    "agent:coder:peer:planner:chat": "agent:coder:peer:from=planner:id=planner%3Achat",
    "agent:coder:peer:planner:secret": "agent:coder:peer:from=planner:id=planner%3Asecret",
    "agent:coder:peer:ticket-42": "agent:coder:peer:id=ticket-42",
    "": "",
}  # fmt: skip
#: The one old key two sources held in turn: the second session's source is x + thread y.
NEW_KEY_OF_SESSION = {NAMED["reopened_x_thread_y"]: "agent:plain:telegram:dm:c=x:t=y"}


def _first(name: str) -> str:
    return str(CONVERSATIONS[f"{name}/first"]["session_id"])


MERGED_PAIRS = (
    "dm-colon", "member-vs-topic", "topic-vs-member", "matrix-room", "matrix-dm",
    "slack-scope", "member-vs-colon-chat", "private-member",
)  # fmt: skip
#: What the report must say of each session (and of no other).
REPORTED = {
    **{_first(pair): key_migration.MERGED for pair in MERGED_PAIRS},
    NAMED["ended_xy"]: key_migration.MERGED,
    NAMED["reopened_x_thread_y"]: key_migration.MERGED,
    NAMED["delegated"]: key_migration.MERGED,  # mallory posted into planner's thread
    NAMED["peer_forged"]: key_migration.FORGED_PEER_THREAD,
    NAMED["peer_no_prefix"]: key_migration.PEER_SENDER_UNKNOWN,
    CONVERSATIONS["slack-thread"]["session_id"]: key_migration.AMBIGUOUS,
}


@pytest.fixture
def old_database(database_url: str) -> str:
    key_fixture.install(database_url)
    return database_url


@pytest.fixture
def upgraded(old_database: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, old_database) as service:
        yield service


def _expected_key(session_id: str, old_key: str) -> str:
    return NEW_KEY_OF_SESSION.get(session_id, NEW_KEYS[old_key])


def _history(service: InProcessSession, agent: str, session_id: str) -> list[str]:
    answer = service.stub.GetHistory(
        pb.GetHistoryRequest(agent=agent, session_id=session_id, limit=1000)
    )
    return [item.message.content for item in answer.messages]


def _resolve(service: InProcessSession, name: str) -> pb.ResolveSessionResponse:
    conversation = CONVERSATIONS[name]
    return service.stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent=conversation["agent"], source=pb.Source(**conversation["source"])
        )
    )


def test_every_session_reads_as_before_but_for_its_key(upgraded: InProcessSession) -> None:
    before = WRITTEN["read"]
    after = key_sample.read_all(upgraded.stub)
    assert set(after) == set(before)
    for session_id, read in before.items():
        old_key = read["session"].get("routing_key", "")
        expected = dict(read)
        expected["session"] = {**read["session"], "routing_key": _expected_key(session_id, old_key)}
        if not expected["session"]["routing_key"]:
            del expected["session"]["routing_key"]
        assert after[session_id] == expected, session_id


def test_every_conversation_resolves_to_its_session(upgraded: InProcessSession) -> None:
    for name, conversation in CONVERSATIONS.items():
        status = WRITTEN["read"][conversation["session_id"]]["session"]["status"]
        if name.endswith("/second") or status == "SESSION_STATUS_ENDED":
            continue
        answer = _resolve(upgraded, name)
        assert (answer.session.session_id, answer.created) == (conversation["session_id"], False)
        before = [m["content"] for m in WRITTEN["read"][answer.session.session_id]["history"]]
        agent = conversation["agent"]
        assert _history(upgraded, agent, answer.session.session_id) == before, name


def test_the_second_conversation_of_a_merged_pair_continues_alone(
    upgraded: InProcessSession,
) -> None:
    """Its old messages stay where they were written (the first conversation's session,
    reported); its next message opens a session that shows nobody else's history."""
    for name, conversation in CONVERSATIONS.items():
        if not name.endswith("/second"):
            continue
        merged = conversation["session_id"]
        answer = _resolve(upgraded, name)
        assert answer.created and answer.session.session_id != merged, name
        assert _history(upgraded, conversation["agent"], answer.session.session_id) == []
        assert f"{name}: a message" in _history(upgraded, conversation["agent"], merged)
        assert merged in REPORTED


#: The redacting agent's threaded conversations, stored with raw threads by 89c0bf6.
PRIVATE_THREADS = {"private-topic": "17585", "private-slack-dm-thread": "171.002"}


def test_a_redacting_agents_threads_keep_their_sessions_until_a_reset(
    upgraded: InProcessSession,
) -> None:
    """Thread ids of redacting agents are hashed now; their conversations from before
    keep their sessions, keyed with the raw thread, by ResolveSession and by a peer's
    SendToPeer. A reset's next session is keyed and stored with the thread hashed, and
    the conversation continues there."""
    stub = upgraded.stub
    stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="relay", peers=["private"])))
    relaying = stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="relay", source=pb.Source(transport="web", conversation_id="r")
        )
    ).session.session_id
    for name, thread in PRIVATE_THREADS.items():
        old_id = CONVERSATIONS[name]["session_id"]
        answer = _resolve(upgraded, name)
        assert (answer.session.session_id, answer.created) == (old_id, False), name
        assert f":t={thread}" in answer.session.routing_key, "its key as the migration left it"
        sent = stub.SendToPeer(
            pb.SendToPeerRequest(
                agent="relay", session_id=relaying, to_agent="private",
                source=pb.Source(**CONVERSATIONS[name]["source"]),
                message=pb.Message(role=pb.ROLE_USER, content="relayed"),
            )
        )  # fmt: skip
        assert sent.event.session_id == old_id, name

        reset = stub.ResetSession(
            pb.ResetSessionRequest(agent="private", session_id=old_id, reason="/new")
        ).session
        hashed = f"thread_{key_sample._sha12(thread)}"
        assert reset.source.thread_id == hashed and reset.routing_key.endswith(f":t={hashed}")
        assert thread not in reset.routing_key
        again = _resolve(upgraded, name)
        assert (again.session.session_id, again.created) == (reset.session_id, False), name
    report = recovery.rebuild(upgraded.unit.core)
    assert not report.differed, report.differences


def test_peer_threads_resolve_for_their_sender_only(upgraded: InProcessSession) -> None:
    stub = upgraded.stub
    task = pb.Message(role=pb.ROLE_USER, content="more", sender="agent:planner")
    again = stub.Delegate(
        pb.DelegateRequest(agent="planner", session_id=NAMED["planning"], to_agent="coder",
                           context="ticket-7", task=task)
    )  # fmt: skip
    assert (again.session.session_id, again.created) == (NAMED["delegated"], False)

    def send(sender: str, session_id: str, conversation: str) -> str:
        message = pb.Message(role=pb.ROLE_USER, content=f"from {sender}")
        answer = stub.SendToPeer(
            pb.SendToPeerRequest(
                agent=sender, session_id=session_id, to_agent="coder", message=message,
                source=pb.Source(transport="peer", conversation_id=conversation),
            )
        )  # fmt: skip
        return str(answer.event.session_id)

    assert send("planner", NAMED["planning"], "planner:chat") == NAMED["peer_chat"]
    forged = send("mallory", NAMED["plotting"], "planner:ticket-7")
    assert forged not in (NAMED["delegated"], NAMED["peer_forged"])
    # A thread whose id named no agent had no sender in its key: it is not reached again.
    assert send("planner", NAMED["planning"], "ticket-42") != NAMED["peer_no_prefix"]


def test_the_report_lists_the_shared_sessions_with_evidence(upgraded: InProcessSession) -> None:
    found = key_migration.reported(upgraded.unit.store)
    assert {f.session_id: f.finding for f in found} == REPORTED
    by_id = {f.session_id: f for f in found}
    topic = by_id[_first("member-vs-topic")]
    assert topic.old_key == "agent:plain:telegram:group:-100123:4242"
    assert topic.new_key == "agent:plain:telegram:group:c=-100123:u=4242"
    assert "agent:plain:telegram:group:c=-100123:t=4242" in topic.evidence  # the other reading
    assert "besides its user 4242: 31337" in topic.evidence
    assert "31337" in by_id[_first("member-vs-topic")].evidence
    assert "77: another reading's user" in by_id[_first("topic-vs-member")].evidence
    assert NAMED["reopened_x_thread_y"] in by_id[NAMED["ended_xy"]].evidence
    assert "agent 'mallory' posted" in by_id[NAMED["delegated"]].evidence
    assert "opened by agent 'mallory'" in by_id[NAMED["peer_forged"]].evidence
    assert [f.finding for f in found] == sorted(
        (f.finding for f in found), key=key_migration.FINDINGS.index
    ), "most severe first"


def test_the_report_is_logged_once_at_start(
    old_database: str, loop_thread: EventLoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING), session_server(loop_thread, old_database):
        pass
    lines = [r.getMessage() for r in caplog.records if r.name == key_migration.__name__]
    assert len(lines) == 1
    assert "11 merged, 1 forged_peer_thread, 1 peer_sender_unknown, 1 ambiguous" in lines[0]
    assert "switchboard session key-report" in lines[0]


def _key_report(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard_cli", "--log-format", "text", "session", "key-report",
         "--database-url", url, *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=dict(os.environ),
    )  # fmt: skip


def test_the_cli_shows_the_report(old_database: str, loop_thread: EventLoopThread) -> None:
    refused = _key_report(old_database)
    assert refused.returncode != 0 and "switchboard db migrate" in refused.stderr
    assert "Traceback" not in refused.stderr
    with session_server(loop_thread, old_database):
        pass
    shown = _key_report(old_database, "--json", "--all")
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert {row["session_id"]: row["finding"] for row in rows} == REPORTED
    table = _key_report(old_database)
    assert table.returncode == 0, table.stderr
    assert "11 merged" in table.stdout and NAMED["peer_forged"] in table.stdout
    ambiguous = CONVERSATIONS["slack-thread"]["session_id"]
    assert "1 ambiguous session(s) not shown" in table.stdout and ambiguous not in table.stdout
    assert ambiguous in _key_report(old_database, "--all").stdout


def test_a_rebuild_after_the_upgrade_finds_the_projections_as_migrated(
    upgraded: InProcessSession,
) -> None:
    """The migration rewrote the rows; replaying the log (format-1 rows read upgraded)
    writes the same ones: keys, routes and summaries byte for byte."""
    report = recovery.rebuild(upgraded.unit.core)
    assert report.events > 0
    assert not report.differed, report.differences


def test_switchboard_session_rebuild_finds_the_migrated_rows(old_database: str) -> None:
    """The operator's rebuild on the old database: it migrates, then replays the log."""
    rebuilt = subprocess.run(
        [sys.executable, "-m", "switchboard_cli", "--log-format", "text", "session", "rebuild",
         "--database-url", old_database],
        capture_output=True, text=True, timeout=300, cwd=ROOT, env=dict(os.environ),
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    for projection in ("agents", "sessions", "routes", "lineage"):
        assert f"{projection}: identical" in rebuilt.stdout, rebuilt.stdout


def _keys_now(service: InProcessSession) -> dict[str, str]:
    store = service.unit.store
    with store.database.connection_context():
        rows = store.database.execute_sql(
            "SELECT session_id, routing_key FROM session_route"
        ).fetchall()
    return {str(session_id): str(key) for session_id, key in rows}


def test_a_checkout_across_the_upgrade_keeps_the_new_keys(upgraded: InProcessSession) -> None:
    """Back to a sequence the old release wrote (its states come from format-1 events
    and snapshots), and forward again: every route and summary keeps its new key."""
    stub = upgraded.stub
    routes = _keys_now(upgraded)
    assert all(key == NEW_KEYS.get(key, key) for key in routes.values())
    checkpoints = stub.ListCheckpoints(pb.ListCheckpointsRequest()).checkpoints
    sequence = {checkpoint.label: checkpoint.sequence for checkpoint in checkpoints}
    stub.Checkout(pb.CheckoutRequest(sequence=sequence["before-branch"]))
    back = _keys_now(upgraded)
    for session_id, key in back.items():
        old = WRITTEN["read"][session_id]["session"].get("routing_key", "")
        assert key == _expected_key(session_id, old), session_id
    assert _resolve(upgraded, "dm-colon/first").session.session_id == _first("dm-colon")
    for session_id in back:
        agent = WRITTEN["read"][session_id]["session"]["agent"]
        got = stub.GetSession(pb.GetSessionRequest(agent=agent, session_id=session_id)).session
        assert got.routing_key == back[session_id]
    stub.Checkout(pb.CheckoutRequest(sequence=sequence["fixture-head"]))
    assert _keys_now(upgraded) == routes
    stub.Rewind(pb.RewindRequest(checkpoint="before-branch"))
    assert _keys_now(upgraded) == back
    assert _resolve(upgraded, "web").session.session_id == CONVERSATIONS["web"]["session_id"]


def test_new_rows_are_written_in_format_2(upgraded: InProcessSession) -> None:
    _resolve(upgraded, "dm-colon/second")
    store = upgraded.unit.store
    with store.database.connection_context():
        formats = store.database.execute_sql(
            "SELECT format, COUNT(*) FROM session_log GROUP BY format ORDER BY format"
        ).fetchall()
    assert [int(f) for f, _ in formats] == [1, storage_format.CURRENT] == [1, 2]
