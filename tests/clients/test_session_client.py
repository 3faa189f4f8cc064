"""SessionClient against real in-process SessionService servers (SQLite and Postgres).

Nothing is mocked: every call goes through the generated stub to a production
server on a real database.
"""

from __future__ import annotations

import copy
import json
import queue
import threading
import time
from typing import Any

import grpc
import pytest
from switchboard_client import (
    SERVICE_CONFIG,
    SESSION_SERVICE_CONFIG,
    EventStream,
    SessionClient,
    SwitchboardError,
)
from switchboard_client.session import REQUEST_ID_METHODS

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession

AGENT = "main"
USER, ASSISTANT = pb.ROLE_USER, pb.ROLE_ASSISTANT
ALLOW, DENY = pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY

READS = {
    "GetAgent",
    "ListAgents",
    "GetSession",
    "ListSessions",
    "GetHistory",
    "GetSessionState",
    "ListCheckpoints",
    "ListLogEvents",
    "ListResumable",
    "GetUserState",
    "GetRecord",
    "ListRecords",
}
#: Every write carries a request id, so a retry is answered, not run again (a
#: deprecated one is ignored: ListResumable no longer writes).
WRITES = {
    method.name
    for method in pb.DESCRIPTOR.services_by_name["SessionService"].methods
    if "request_id" in method.input_type.fields_by_name
    and not method.input_type.fields_by_name["request_id"].GetOptions().deprecated
}
RETRIED = READS | WRITES
NOT_RETRIED: set[str] = set()
#: Long-lived: WatchEvents, and CallStream (the clients' carrier of concurrent writes).
STREAMING = {"WatchEvents", "CallStream"}


def raised(error: pytest.ExceptionInfo[SwitchboardError]) -> tuple[grpc.StatusCode, str]:
    return error.value.code, error.value.reason


def rule(effect: Any, action: str, resource: str = "*") -> pb.PermissionRule:
    return pb.PermissionRule(effect=effect, action=action, resource=resource)


def web_session(client: SessionClient, conversation: str = "tab-1", agent: str = AGENT) -> str:
    return client.resolve(agent, transport="web", conversation_id=conversation).session.session_id


def contents(messages: list[pb.QueuedMessage]) -> list[str]:
    return [queued.message.content for queued in messages]


# -- agents -------------------------------------------------------------------------------


def test_agents_create_update_memory_list_and_archive(session_client: SessionClient) -> None:
    created = session_client.create_agent(
        AGENT, display_name="Main", workspace_root="/srv/main", memory={"tz": "UTC"}
    )
    assert (created.name, created.display_name, created.version) == (AGENT, "Main", 1)
    assert dict(created.memory) == {"tz": "UTC"}
    with pytest.raises(SwitchboardError) as error:
        session_client.create_agent(AGENT)
    assert raised(error) == (grpc.StatusCode.ALREADY_EXISTS, "AGENT_EXISTS")

    assert dict(session_client.put_memory(AGENT, "lang", "en").memory) == {
        "tz": "UTC",
        "lang": "en",
    }
    assert dict(session_client.delete_memory(AGENT, "tz").memory) == {"lang": "en"}
    renamed = session_client.update_agent(
        pb.Agent(name=AGENT, display_name="Renamed", workspace_root="/ignored"), ["display_name"]
    )
    assert (renamed.display_name, renamed.workspace_root) == ("Renamed", "/srv/main")
    assert session_client.get_agent(AGENT) == renamed

    for name in ("d", "c", "b"):
        session_client.create_agent(name)
    assert [a.name for a in session_client.list_agents(page_size=2)] == ["b", "c", "d", AGENT]
    archived = session_client.delete_agent("c")
    assert archived.archived
    assert session_client.delete_agent("c") == archived, "archiving again changes nothing"
    assert [a.name for a in session_client.list_agents(page_size=1)] == ["b", "d", AGENT]
    everyone = session_client.list_agents(include_archived=True, page_size=3)
    assert [a.name for a in everyone] == ["b", "c", "d", AGENT]
    with pytest.raises(SwitchboardError) as error:
        web_session(session_client, agent="c")
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "AGENT_ARCHIVED")


# -- a conversation -----------------------------------------------------------------------


def test_a_conversation_resolves_appends_and_reads_back(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    first = session_client.resolve(
        AGENT,
        transport="slack",
        chat_type=pb.CHAT_TYPE_CHANNEL,
        chat_id="C1",
        user_id="U1",
        scope_id="T1",
    )
    assert first.created
    again = session_client.resolve(
        AGENT,
        transport="slack",
        chat_type=pb.CHAT_TYPE_CHANNEL,
        chat_id="C1",
        user_id="U1",
        scope_id="T1",
    )
    assert not again.created and again.session == first.session
    other_user = session_client.resolve(
        AGENT, transport="slack", chat_type=pb.CHAT_TYPE_CHANNEL, chat_id="C1", user_id="U2"
    )
    assert other_user.session.session_id != first.session.session_id
    session = first.session
    assert session.routing_key == "agent:main:slack:channel:s=T1:c=C1:u=U1"
    assert (session.source.transport, session.source.chat_type) == ("slack", pb.CHAT_TYPE_CHANNEL)
    sid = session.session_id

    asked = session_client.append_message(AGENT, sid, USER, "what is 2+2?", sender="U1")
    answered = session_client.append_message(
        AGENT, sid, ASSISTANT, "4", expected_version=asked.version, metadata={"model": "m1"}
    )
    assert (asked.version, answered.version) == (2, 3)

    history = session_client.history(AGENT, sid)
    assert contents(history) == ["what is 2+2?", "4"]
    assert [q.sequence for q in history] == [asked.events[0].sequence, answered.events[0].sequence]
    assert [q.message.role for q in history] == [USER, ASSISTANT]
    assert history[0].message.sender == "U1"
    assert dict(history[1].message.metadata) == {"model": "m1"}
    assert contents(session_client.history(AGENT, sid, limit=1, newest=True)) == ["4"]
    assert contents(session_client.history(AGENT, sid, after=history[0].sequence)) == ["4"]

    state = session_client.state(AGENT, sid)
    assert state.agent.name == AGENT
    assert state.state.session.session_id == sid
    assert (state.state.session.version, state.state.session.message_count) == (3, 2)
    assert session_client.get_session(AGENT, sid) == state.state.session


def test_append_many_events_at_once_and_post_to_the_inbox(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    appended = session_client.append(
        AGENT,
        sid,
        pb.SessionEventInput(task_set=pb.TaskSet(task=pb.Task(task_id="t1", description="sum"))),
        pb.SessionEventInput(temp_state_changed=pb.TempStateChanged(set={"step": "1"})),
        expected_version=1,
    )
    assert appended.version == 3
    assert [e.WhichOneof("body") for e in appended.events] == ["task_set", "temp_state_changed"]

    posted = session_client.post_to_inbox(AGENT, sid, pb.Message(role=USER, content="also this"))
    assert posted.inbox_posted.message.content == "also this"

    state = session_client.state(AGENT, sid).state
    assert [(q.sequence, q.message.content) for q in state.inbox] == [
        (posted.sequence, "also this")
    ]
    assert state.current_task.task_id == "t1"
    assert dict(state.temp_state) == {"step": "1"}
    assert state.session.version == 3, "an inbox post does not move the version"
    assert session_client.history(AGENT, sid) == [], "neither event is a history message"


def test_joining_an_unknown_session_raises_not_found(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    assert session_client.join(AGENT, sid).session_id == sid
    with pytest.raises(SwitchboardError) as error:
        session_client.join(AGENT, "s_nobody")
    assert raised(error) == (grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
    assert [s.session_id for s in session_client.list_sessions(AGENT)] == [sid], "nothing created"


def test_a_stale_expected_version_raises_aborted(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    turn = session_client.append_message(AGENT, sid, USER, "first", expected_version=1)
    assert turn.version == 2
    with pytest.raises(SwitchboardError) as error:
        session_client.append_message(AGENT, sid, ASSISTANT, "late", expected_version=1)
    assert raised(error) == (grpc.StatusCode.ABORTED, "VERSION_MISMATCH")
    assert error.value.metadata == {"version": "2"}
    assert contents(session_client.history(AGENT, sid)) == ["first"], "nothing was appended"
    session_client.append_message(AGENT, sid, ASSISTANT, "on time", expected_version=2)
    assert contents(session_client.history(AGENT, sid)) == ["first", "on time"]


def test_spawn_end_and_reset(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    routed = web_session(session_client)
    spawned = session_client.spawn(AGENT, "job-1", temp_state={"k": "v"})
    assert (spawned.session_id, spawned.routing_key) == ("job-1", "")
    assert dict(session_client.state(AGENT, "job-1").state.temp_state) == {"k": "v"}
    with pytest.raises(SwitchboardError) as error:
        session_client.spawn(AGENT, "job-1")
    assert raised(error) == (grpc.StatusCode.ALREADY_EXISTS, "SESSION_EXISTS")
    generated = session_client.spawn(AGENT).session_id
    assert generated.startswith("s_"), "a generated id"

    ended = session_client.end(AGENT, "job-1", "done")
    assert (ended.status, ended.end_reason) == (pb.SESSION_STATUS_ENDED, "done")
    assert session_client.end(AGENT, "job-1", "again") == ended, "ending again changes nothing"
    with pytest.raises(SwitchboardError) as error:
        session_client.append_message(AGENT, "job-1", USER, "hello?")
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "SESSION_ENDED")

    reset = session_client.reset(AGENT, routed, "/new")
    assert (reset.ended.session_id, reset.ended.end_reason) == (routed, "/new")
    assert reset.session.session_id != routed
    assert web_session(session_client) == reset.session.session_id, "the key moved on"
    open_ones = session_client.list_sessions(AGENT, status=pb.SESSION_STATUS_OPEN)
    assert {s.session_id for s in open_ones} == {generated, reset.session.session_id}


def test_list_sessions_follows_page_tokens_newest_first(
    session_client: SessionClient, session: InProcessSession
) -> None:
    session_client.create_agent(AGENT)
    ids = [web_session(session_client, f"tab-{n}") for n in range(5)]
    session_client.spawn(AGENT, "not-web")
    first_page = session.stub.ListSessions(pb.ListSessionsRequest(agent=AGENT, page_size=2))
    assert len(first_page.sessions) == 2 and first_page.next_page_token, "really paged"

    listed = session_client.list_sessions(AGENT, transport="web", page_size=2)
    assert [s.session_id for s in listed] == ids[::-1]
    assert len(list(session_client.list_sessions(AGENT, page_size=2))) == 6


def test_resume_marks_and_suspension(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    interrupted, suspended = web_session(session_client, "a"), web_session(session_client, "b")
    marked = session_client.mark_resumable(AGENT, interrupted)
    assert marked.resume_pending and marked.HasField("resume_marked_time")
    session_client.mark_resumable(AGENT, suspended)
    assert session_client.suspend(AGENT, suspended).suspended

    resumable = session_client.list_resumable(AGENT)
    assert [s.session_id for s in resumable.sessions] == [interrupted]
    assert list(resumable.stale) == []
    assert session_client.expire_resumable(AGENT) == [], "nothing stale to reset"

    assert not session_client.suspend(AGENT, suspended, suspended=False).suspended
    assert not session_client.mark_resumable(AGENT, interrupted, pending=False).resume_pending
    assert [s.session_id for s in session_client.list_resumable(AGENT).sessions] == [suspended]


# -- watching the log ---------------------------------------------------------------------


def consume(stream: EventStream, into: queue.Queue[object]) -> threading.Thread:
    """Iterates `stream` on a thread: each event, then any exception, then "done"."""

    def run() -> None:
        try:
            for event in stream:
                into.put(event)
        except BaseException as exc:
            into.put(exc)
        finally:
            into.put("done")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_yields_live_events_until_cancelled(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    noise = web_session(session_client, "elsewhere")
    before = session_client.append_message(AGENT, sid, USER, "before").events[0]

    received: queue.Queue[object] = queue.Queue()
    stream = session_client.watch(after=before.sequence - 1, session_id=sid)
    thread = consume(stream, received)
    assert received.get(timeout=10) == before, "the stream is up and caught up"

    session_client.append_message(AGENT, noise, USER, "not watched")
    live = session_client.append_message(AGENT, sid, ASSISTANT, "live").events[0]
    assert received.get(timeout=10) == live
    assert live.message_appended.message.content == "live"

    stream.cancel()
    thread.join(timeout=10)
    assert not thread.is_alive(), "cancel ends a blocked iteration"
    assert received.get(timeout=1) == "done", "and ends it quietly, not with an error"
    assert received.empty()


def test_watch_has_no_deadline_unless_asked(
    session_client: SessionClient, session: InProcessSession
) -> None:
    """The service-wide timeout must not cut watches: WatchEvents has its own entry.

    Shrinking every timeout in the config (and the client's) to 0.3s shows it: the
    stream outlives it, and without the WatchEvents entry the same stream dies of
    DEADLINE_EXCEEDED.
    """
    session_client.create_agent(AGENT)
    sid = web_session(session_client)

    def with_short_timeouts(config: dict[str, Any]) -> dict[str, Any]:
        short = copy.deepcopy(config)
        for entry in short["methodConfig"]:
            if "timeout" in entry:
                entry["timeout"] = "0.3s"
        return short

    def watched_after_a_pause(config: dict[str, Any]) -> pb.Event:
        options = [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]
        channel = grpc.insecure_channel(session.address, options=options)
        try:
            client = SessionClient("unused:1", channel=channel, timeout_s=0.3)
            with client.watch(session_id=sid) as stream:
                assert next(stream).HasField("session_opened")
                time.sleep(1.0)
                session_client.append_message(AGENT, sid, USER, "after the pause")
                return next(stream)
        finally:
            channel.close()

    event = watched_after_a_pause(with_short_timeouts(SESSION_SERVICE_CONFIG))
    assert event.message_appended.message.content == "after the pause"

    without_stream_entry = with_short_timeouts(SESSION_SERVICE_CONFIG)
    without_stream_entry["methodConfig"] = [
        entry for entry in without_stream_entry["methodConfig"] if "timeout" in entry
    ]
    with pytest.raises(SwitchboardError) as error:
        watched_after_a_pause(without_stream_entry)
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED

    with session_client.watch(session_id=sid, timeout_s=0.5) as bounded:
        assert [next(bounded).sequence for _ in range(2)]
        started = time.monotonic()
        with pytest.raises(SwitchboardError) as error:
            next(bounded)
        assert time.monotonic() - started < 10
    assert error.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


# -- time travel --------------------------------------------------------------------------


def test_rewind_to_a_checkpoint_label_restores_history(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    session_client.append_message(AGENT, sid, USER, "keep me")
    mark = session_client.create_checkpoint("before-tangent")
    with pytest.raises(SwitchboardError) as error:
        session_client.create_checkpoint("before-tangent")
    assert raised(error) == (grpc.StatusCode.ALREADY_EXISTS, "CHECKPOINT_EXISTS")
    session_client.append_message(AGENT, sid, ASSISTANT, "tangent")
    head = session_client.append_message(AGENT, sid, USER, "more tangent").events[0].sequence
    assert contents(session_client.history(AGENT, sid)) == ["keep me", "tangent", "more tangent"]

    record = session_client.rewind("before-tangent")
    assert (record.rewound.to_sequence, record.rewound.checkpoint) == (
        mark.sequence,
        "before-tangent",
    )
    assert contents(session_client.history(AGENT, sid)) == ["keep me"]
    audit = session_client.history(AGENT, sid, include_abandoned=True)
    assert [(q.message.content, q.abandoned) for q in audit] == [
        ("keep me", False),
        ("tangent", True),
        ("more tangent", True),
    ]
    assert [c.label for c in session_client.list_checkpoints()] == ["before-tangent"]
    with pytest.raises(SwitchboardError) as error:
        session_client.rewind("no-such-label")
    assert raised(error) == (grpc.StatusCode.NOT_FOUND, "CHECKPOINT_NOT_FOUND")

    back = session_client.checkout(head)
    assert back.rewound.checkout and back.rewound.to_sequence == head
    assert contents(session_client.history(AGENT, sid)) == ["keep me", "tangent", "more tangent"]

    by_sequence = session_client.rewind(mark.sequence)
    assert (by_sequence.rewound.to_sequence, by_sequence.rewound.checkpoint) == (mark.sequence, "")
    assert contents(session_client.history(AGENT, sid)) == ["keep me"]
    with pytest.raises(TypeError):
        session_client.rewind(True)


def test_snapshot_then_truncate_the_log(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    sid = web_session(session_client)
    last = session_client.append_message(AGENT, sid, USER, "hi").events[0].sequence
    with pytest.raises(SwitchboardError) as error:
        session_client.truncate_log(last)
    assert raised(error) == (grpc.StatusCode.FAILED_PRECONDITION, "SNAPSHOT_NEEDED")
    assert session_client.snapshot(AGENT, sid) == last
    truncated = session_client.truncate_log(last)
    assert truncated.retained_from == last and truncated.deleted_count > 0
    assert contents(session_client.history(AGENT, sid)) == ["hi"]


# -- several agents -----------------------------------------------------------------------


def test_delegate_send_to_peer_fork_and_check_permission(session_client: SessionClient) -> None:
    session_client.create_agent("helper")
    session_client.create_agent(
        AGENT,
        peers=["helper"],
        workspace_root="/srv/main",
        permissions=[rule(ALLOW, "fs.read", "workspace:*")],
    )
    sid = web_session(session_client)
    task = pb.Message(role=USER, content="summarise the thread")

    delegated = session_client.delegate(AGENT, sid, "helper", task, context="summary")
    assert delegated.created and delegated.session.agent == "helper"
    assert delegated.session.lineage.parent_session_id == sid
    assert delegated.session.lineage.delegated
    resumed = session_client.delegate(AGENT, sid, "helper", task, context="summary")
    assert not resumed.created and resumed.session.session_id == delegated.session.session_id
    helper_sid = delegated.session.session_id

    note = pb.Message(role=USER, content="one more thing")
    by_id = session_client.send_to_peer(AGENT, sid, "helper", note, to_session_id=helper_sid)
    assert by_id.session_id == helper_sid
    inbox = session_client.state("helper", helper_sid).state.inbox
    assert [q.message.content for q in inbox] == [task.content, task.content, note.content]
    routed = pb.Source(transport="web", conversation_id="side")
    by_source = session_client.send_to_peer(AGENT, sid, "helper", note, source=routed)
    assert by_source.session_id not in ("", helper_sid), "a new session for that source"
    with pytest.raises(SwitchboardError) as error:
        session_client.send_to_peer("helper", helper_sid, AGENT, note, to_session_id=sid)
    assert raised(error) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")

    allowed = session_client.check_permission(AGENT, sid, "fs.read", "workspace:docs/a.md")
    assert allowed.decision.allowed and allowed.decision.rule == "agent[0]"
    assert allowed.sequence > by_source.sequence, "the decision is logged"
    assert not session_client.check_permission(AGENT, sid, "shell.run", "ls").decision.allowed

    session_client.append_message(AGENT, sid, USER, "branch here")
    fork = session_client.fork(AGENT, sid, narrowing=[rule(DENY, "fs.read")])
    assert fork.lineage.parent_session_id == sid and not fork.lineage.delegated
    assert contents(session_client.history(AGENT, fork.session_id)) == ["branch here"]
    denied = session_client.check_permission(AGENT, fork.session_id, "fs.read", "workspace:a")
    assert (denied.decision.allowed, denied.decision.rule) == (False, "narrowing[0][0]")
    early = session_client.fork(AGENT, sid, at_sequence=allowed.sequence)
    assert session_client.history(AGENT, early.session_id) == []


# -- the client itself --------------------------------------------------------------------


def test_close_closes_only_a_channel_the_client_created(session: InProcessSession) -> None:
    channel = grpc.insecure_channel(session.address)
    try:
        with SessionClient("unused:1", channel=channel) as borrowed:
            assert list(borrowed.list_agents()) == []
        assert list(SessionClient("unused:1", channel=channel).list_checkpoints()) == []
    finally:
        channel.close()

    owned = SessionClient(session.address)
    owned.list_checkpoints()
    owned.close()
    with pytest.raises(ValueError, match="closed channel"):
        owned.list_checkpoints()


def test_service_config_retries_exactly_the_idempotent_methods() -> None:
    service = pb.DESCRIPTOR.services_by_name["SessionService"]
    methods = {method.name for method in service.methods}
    assert methods == RETRIED | NOT_RETRIED | STREAMING, "every method is classified"
    assert set(REQUEST_ID_METHODS) == WRITES, "the client sets ids for exactly the writes"
    assert len(WRITES) == 29
    streaming = {m.name for m in service.methods if m.server_streaming or m.client_streaming}
    assert streaming == STREAMING

    config = json.loads(json.dumps(SESSION_SERVICE_CONFIG))
    assert config == SESSION_SERVICE_CONFIG, "the config is plain JSON"
    assert config != SERVICE_CONFIG, "the delivery config is another one"
    entries = config["methodConfig"]
    for entry in entries:
        assert all(name["service"] == service.full_name for name in entry["name"])
    named = [name.get("method") for entry in entries for name in entry["name"]]
    assert len(named) == len(set(named)), "a method in two entries: gRPC rejects the config"

    retrying = [entry for entry in entries if "retryPolicy" in entry]
    retried = [name.get("method") for entry in retrying for name in entry["name"]]
    assert sorted(retried) == sorted(RETRIED), "a misspelt method is silently not retried"
    for entry in retrying:
        assert entry["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
        assert entry["retryPolicy"]["maxAttempts"] > 1

    def entry_for(method: str) -> dict[str, object]:
        """gRPC's lookup: the exact method name first, then the service-wide entry."""
        for entry in entries:
            if {"service": service.full_name, "method": method} in entry["name"]:
                return dict(entry)
        for entry in entries:
            if {"service": service.full_name} in entry["name"]:
                return dict(entry)
        raise AssertionError(f"{method} has no method config")

    for method in methods:
        entry = entry_for(method)
        assert ("retryPolicy" in entry) == (method in RETRIED), method
        timeout = entry.get("timeout")
        if method in STREAMING:
            assert timeout is None, f"{method} is long-lived: no timeout"
            continue
        assert isinstance(timeout, str) and timeout.endswith("s"), method
        assert float(timeout[:-1]) > 0, method


def test_history_pages_and_the_log_read(session_client: SessionClient) -> None:
    session_client.create_agent(AGENT)
    session_id = web_session(session_client, "paged")
    for n in range(5):
        session_client.append_message(AGENT, session_id, pb.ROLE_USER, f"m{n}")
    backwards = [
        [m.message.content for m in page.messages]
        for page in session_client.history_pages(AGENT, session_id, newest=True, limit=2)
    ]
    assert backwards == [["m3", "m4"], ["m1", "m2"], ["m0"]]
    logged = session_client.list_log_events(
        session_id=session_id, event_types=["message_appended"], page_size=2
    )
    assert [e.event.message_appended.message.content for e in logged] == [f"m{n}" for n in range(5)]
    assert [c.label for c in session_client.list_checkpoints(page_size=1)] == []
