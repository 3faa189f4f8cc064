"""Fuzzing every SessionService RPC: each answer is a success or a clear status with
an ErrorInfo, and a rejected request leaves the database as it was.

One server per RPC and backend, seeded with two agents ("main" with "helper" as its
peer), sessions (open, spawned, ended, and one of "helper"), history with a tool
cycle, an inbox message, a checkpoint and page tokens; then Hypothesis sends that
RPC requests built from valid values mixed with hostile ones (see hostile.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc
import pytest
from google.protobuf import field_mask_pb2
from google.protobuf.message import Message
from hypothesis import strategies as st

from session_service.migrations import FRAMEWORK_TABLES
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.fuzz.checks import (
    Answer,
    KnownBug,
    backend_of,
    carried_calls,
    check_repro,
    check_request_table,
    describe,
    fuzz_rpc,
    mark_if_open,
)
from tests.fuzz.hostile import (
    OMIT,
    Field,
    boolean,
    duration,
    empty_request,
    enum,
    fixed,
    message,
    message_of,
    optional,
    page_token,
    repeated,
    request,
    string_list,
    string_map,
    text,
    uint32,
    uint64,
    union,
)
from tests.harness import EventLoopThread, InProcessSession, session_server

pytestmark = [pytest.mark.fuzz]

S = st.SearchStrategy
SERVICE: Final = pb.DESCRIPTOR.services_by_name["SessionService"]


# -- seeded state ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Seed:
    session_id: str  # main's session, routed from web tab-1, with history
    helper_session_id: str
    spawned_id: str
    ended_id: str
    created_seq: int  # the sequence that opened session_id
    head: int
    checkpoint: str
    agents_token: str  # ListAgents(page_size=1)
    sessions_token: str  # ListSessions(agent="main", page_size=1)


def seed(stub: pb_grpc.SessionServiceStub) -> Seed:
    allow, deny = pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY
    stub.CreateAgent(
        pb.CreateAgentRequest(
            agent=pb.Agent(
                name="main",
                display_name="Main",
                workspace_root="ws",
                peers=["helper"],
                memory={"greeting": "hello"},
                permissions=[
                    pb.PermissionRule(effect=allow, action="fs.*", resource="workspace:*"),
                    pb.PermissionRule(effect=deny, action="fs.write", resource="workspace:secret*"),
                ],
            )
        )
    )
    stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="helper")))
    web = pb.Source(transport="web", conversation_id="tab-1")
    opened = stub.ResolveSession(pb.ResolveSessionRequest(agent="main", source=web)).session
    helper = stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="helper", source=pb.Source(transport="web", conversation_id="tab-h")
        )
    ).session
    stub.SpawnSession(
        pb.SpawnSessionRequest(agent="main", session_id="fixed-session", temp_state={"k": "v"})
    )
    stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="ended-session"))
    stub.EndSession(pb.EndSessionRequest(agent="main", session_id="ended-session", reason="done"))
    call_c1 = pb.ToolCall(id="c1", name="search", arguments="{}")
    events = [
        pb.Message(role=pb.ROLE_USER, content="hello"),
        pb.Message(role=pb.ROLE_ASSISTANT, content="", tool_calls=[call_c1]),
        pb.Message(role=pb.ROLE_TOOL, content="result", tool_call_id="c1"),
        pb.Message(role=pb.ROLE_ASSISTANT, content="done"),
    ]
    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="main",
            session_id=opened.session_id,
            events=[
                pb.SessionEventInput(message_appended=pb.MessageAppended(message=m)) for m in events
            ],
        )
    )
    stub.PostToInbox(
        pb.PostToInboxRequest(
            agent="main",
            session_id=opened.session_id,
            message=pb.Message(role=pb.ROLE_USER, content="queued"),
        )
    )
    checkpoint = stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="cp-1")).checkpoint
    agents_token = stub.ListAgents(pb.ListAgentsRequest(page_size=1)).next_page_token
    sessions_token = stub.ListSessions(
        pb.ListSessionsRequest(agent="main", page_size=1)
    ).next_page_token
    assert agents_token and sessions_token
    return Seed(
        session_id=opened.session_id,
        helper_session_id=helper.session_id,
        spawned_id="fixed-session",
        ended_id="ended-session",
        created_seq=opened.create_sequence,
        head=checkpoint.sequence,
        checkpoint=checkpoint.label,
        agents_token=agents_token,
        sessions_token=sessions_token,
    )


# -- field strategies -----------------------------------------------------------------------

AGENT: Final = text("main", "main", "helper", "ghost")
NEW_AGENT: Final = text(
    strategy=st.one_of(st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True), st.just("main"))
)
KEY: Final = text("k", "greeting", "a.b")
VALUE: Final = text("", "v", "multi\nline")
RULE: Final = message(
    pb.PermissionRule,
    effect=enum([pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY], invalid=[0]),
    action=text("fs.read", "fs.*", "peer.*", "memory.write", "*"),
    resource=text("workspace:*", "workspace:docs/*", "agent:helper", ""),
)
SETTINGS: Final = message(
    pb.AgentSettings,
    redact_pii=boolean(),
    routing=optional(
        message(
            pb.RoutingPolicy, shared_group_sessions=boolean(), per_user_thread_sessions=boolean()
        )
    ),
    resume=optional(
        message(pb.ResumePolicy, freshness_window=duration(0, 60, 3600), never_resume=boolean())
    ),
    reset=optional(
        message(
            pb.ResetPolicy,
            mode=enum([0, 1, 2]),
            idle_after=duration(60, 3600),
            daily_at_hour=uint32(0, 4, 23),
        )
    ),
)


def agent_message(name: Field) -> Field:
    return message(
        pb.Agent,
        name=name,
        display_name=text("", "Main agent"),
        memory=string_map(KEY, VALUE, {}, {"greeting": "hi"}),
        permissions=repeated(RULE),
        workspace_root=text("", "ws", "/srv/agents/ws"),
        peers=string_list(AGENT, [], ["helper"], ["main", "helper"]),
        settings=optional(SETTINGS),
        archived=boolean(),
        version=uint64(0),
        last_sequence=uint64(0),
        parent=text("", "", "main", "ghost"),
    )


TOOL_CALL: Final = message(
    pb.ToolCall, id=text("c1", "c2"), name=text("search", ""), arguments=text("{}", '{"q": 1}')
)
MESSAGE: Final = message(
    pb.Message,
    role=enum([pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_SYSTEM, pb.ROLE_TOOL], invalid=[0]),
    content=text("hi", "Some reply.\nSecond line", ""),
    sender=text("", "U1"),
    message_ref=text("", "m1"),
    tool_calls=repeated(TOOL_CALL, max_valid=1),
    tool_call_id=text("", "c1"),
    metadata=string_map(KEY, VALUE, {}, {"k": "v"}),
)
NON_CHAT_SOURCE: Final = message(
    pb.Source,
    transport=text("web", "cron", "repl", "peer"),
    conversation_id=text("tab-1", "tab-2", "job:nightly", "main:ctx"),
    chat_type=fixed(OMIT),
)
CHAT_SOURCE: Final = message(
    pb.Source,
    transport=text("slack", "telegram", "discord", "google_chat"),
    chat_type=enum([1, 2, 3, 4], invalid=[0]),
    chat_id=text("C1", "spaces/AAA/threads/BBB", "-100123"),
    thread_id=text("", "171.001"),
    user_id=text("", "U1"),
    scope_id=text("", "T1"),
)
FRAMEWORK_SOURCE: Final = message(
    pb.Source,
    transport=text("adk", "openai_agents", "langgraph"),
    conversation_id=text("s-1", "thread:9"),
    user_id=text("", "alice", "org:7"),
    chat_type=fixed(OMIT),
)
SOURCE: Final = union(NON_CHAT_SOURCE, CHAT_SOURCE, FRAMEWORK_SOURCE)
JSON_VALUE: Final = text("1", '"text"', '{"a": [1, 2]}', "null")
STATE_DELTA: Final = message(
    pb.StateDelta,
    scope=enum([1, 2, 3], invalid=[0]),
    user_id=fixed(""),
    set=string_map(KEY, JSON_VALUE, {"k": "1"}, {"greeting": '"hi"'}),
    removed=string_list(KEY, [], ["gone"]),
)
RECORD_KIND: Final = text("checkpoint", "writes", "blob.v1")
STORED_RECORD: Final = message(
    pb.StoredRecord,
    kind=RECORD_KIND,
    namespace=text("", "child:1"),
    key=text("c1", "c2", "1ef4-uuid"),
    parent_key=text("", "c1"),
    metadata=text("", '{"step": 1}', '{"source": "loop", "run_id": "r1"}'),
    payload=fixed(b"\x80\x04blob"),
    labels=string_map(text("run_id", "kind"), VALUE, {}, {"run_id": "r1"}),
)
LABEL_FILTER: Final = message(
    pb.RecordLabelFilter, name=text("run_id"), values=string_list(text("r1", "r2"), ["r1"])
)


def sequences(seed: Seed) -> Field:
    """A repeated uint64 of sequences: a few of the log's, or hostile numbers."""
    good = st.lists(st.sampled_from([seed.created_seq, seed.head - 1, seed.head]), max_size=3)
    bad = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=300)
    return Field(good, bad)


NARROWING: Final = message(pb.Narrowing, rules=repeated(RULE))


def _session(seed: Seed) -> Field:
    return text(
        seed.session_id,
        seed.session_id,
        seed.spawned_id,
        seed.ended_id,
        seed.helper_session_id,
        "s_unknown",
    )


def _sequence(seed: Seed) -> Field:
    return uint64(0, 1, seed.created_seq, seed.head - 1, seed.head, seed.head + 1)


def _owned(seed: Seed) -> S[dict[str, Any]]:
    """An agent with one of its sessions (the main one most often)."""
    return st.sampled_from(
        [
            {"agent": "main", "session_id": seed.session_id},
            {"agent": "main", "session_id": seed.session_id},
            {"agent": "main", "session_id": seed.spawned_id},
            {"agent": "main", "session_id": seed.ended_id},
            {"agent": "helper", "session_id": seed.helper_session_id},
        ]
    )


def _merged(*bases: S[dict[str, Any]]) -> S[dict[str, Any]]:
    def merge(*parts: dict[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for part in parts:
            merged.update(part)
        return merged

    return st.builds(merge, *bases)


def _event_inputs(seed: Seed) -> Field:
    def body(name: str, field: Field) -> Field:
        return message_of(pb.SessionEventInput, {name: field})

    bodies = union(
        body("message_appended", message(pb.MessageAppended, message=MESSAGE)),
        body("inbox_drained", message(pb.InboxDrained, through_sequence=_sequence(seed))),
        body("outbox_queued", message(pb.OutboxQueued, message=MESSAGE)),
        body("outbox_acked", message(pb.OutboxAcked, through_sequence=_sequence(seed))),
        body(
            "task_set",
            message(
                pb.TaskSet,
                task=message(pb.Task, task_id=text("t1"), description=text("do it", "")),
            ),
        ),
        body("task_cleared", fixed(pb.TaskCleared())),
        body(
            "temp_state_changed",
            message(
                pb.TempStateChanged,
                set=string_map(KEY, VALUE, {"k": "v2"}),
                removed=string_list(KEY, [], ["k"]),
            ),
        ),
    )
    no_body = Field(st.nothing(), st.just(pb.SessionEventInput()))
    return repeated(union(bodies, no_body), min_valid=1)


def _update_mask() -> Field:
    path = text(
        "display_name",
        "permissions",
        "workspace_root",
        "peers",
        "settings",
        "parent",
        "settings.resume",
        "settings.reset.mode",
        "memory",
        "name",
        "version",
        "settings.bogus",
        "display_name.x",
    )
    return message(
        field_mask_pb2.FieldMask,
        paths=string_list(
            path,
            ["display_name"],
            ["permissions", "peers"],
            ["settings"],
            ["settings.reset.mode", "workspace_root"],
        ),
    )


RequestStrategy = Callable[[Seed], S[Message]]


def _owned_request(cls: type[Message], **fields: Field) -> RequestStrategy:
    def build(seed: Seed) -> S[Message]:
        owned = {"agent": AGENT, "session_id": _session(seed), **fields}
        return request(message_of(cls, owned, base=_owned(seed)))

    return build


def _rewind(seed: Seed) -> S[Message]:
    one_target = st.sampled_from(
        [{"sequence": OMIT}, {"checkpoint": OMIT}, {"sequence": OMIT, "checkpoint": OMIT}]
    )
    return request(
        message(
            pb.RewindRequest,
            base=one_target,
            sequence=_sequence(seed),
            checkpoint=text(seed.checkpoint, "no-such-label"),
        )
    )


def _send_to_peer(seed: Seed) -> S[Message]:
    base = _merged(
        st.just({"agent": "main", "session_id": seed.session_id, "to_agent": "helper"}),
        st.sampled_from([{"source": OMIT}, {"to_session_id": OMIT}, {"source": OMIT}]),
    )
    return request(
        message(
            pb.SendToPeerRequest,
            base=base,
            agent=AGENT,
            session_id=_session(seed),
            to_agent=AGENT,
            source=SOURCE,
            to_session_id=text(seed.helper_session_id, "s_unknown"),
            message=MESSAGE,
        )
    )


#: Every RPC of the SessionService and how its requests are built.
REQUESTS: Final[dict[str, RequestStrategy]] = {
    "CreateAgent": lambda seed: request(
        message(pb.CreateAgentRequest, agent=agent_message(NEW_AGENT))
    ),
    "GetAgent": lambda seed: request(message(pb.GetAgentRequest, name=AGENT)),
    "ListAgents": lambda seed: request(
        message(
            pb.ListAgentsRequest,
            base=st.sampled_from([{"include_archived": False}, {}]),
            include_archived=boolean(),
            page_size=uint32(0, 1, 2, 1000),
            page_token=page_token([seed.agents_token], foreign=[seed.sessions_token]),
        )
    ),
    "UpdateAgent": lambda seed: request(
        message(
            pb.UpdateAgentRequest,
            agent=agent_message(text("main", "helper", "ghost")),
            update_mask=_update_mask(),
        )
    ),
    "DeleteAgent": lambda seed: request(
        message(pb.DeleteAgentRequest, name=text("helper", "ghost", "main"))
    ),
    "PutMemory": lambda seed: request(
        message(pb.PutMemoryRequest, agent=AGENT, key=KEY, value=VALUE)
    ),
    "DeleteMemory": lambda seed: request(message(pb.DeleteMemoryRequest, agent=AGENT, key=KEY)),
    "ResolveSession": lambda seed: request(
        message(
            pb.ResolveSessionRequest,
            base=st.sampled_from([{"session_id": ""}, {"session_id": ""}, {"source": OMIT}]),
            agent=AGENT,
            source=optional(SOURCE),
            session_id=text("", seed.session_id, seed.spawned_id, seed.ended_id),
        )
    ),
    "SpawnSession": lambda seed: request(
        message(
            pb.SpawnSessionRequest,
            agent=AGENT,
            session_id=text(
                strategy=st.one_of(
                    st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True),
                    st.sampled_from(["", "fixed-session", "a.b"]),
                )
            ),
            temp_state=string_map(KEY, VALUE, {}, {"k": "v"}),
        )
    ),
    "GetSession": _owned_request(pb.GetSessionRequest),
    "ListSessions": lambda seed: request(
        message(
            pb.ListSessionsRequest,
            base=st.sampled_from([{"agent": "main", "status": 0, "transport": ""}, {}]),
            agent=AGENT,
            status=enum([0, 1, 2]),
            transport=text("", "web", "slack"),
            page_size=uint32(0, 1, 2, 1000),
            page_token=page_token([seed.sessions_token], foreign=[seed.agents_token]),
        )
    ),
    "EndSession": _owned_request(pb.EndSessionRequest, reason=text("", "done", "/new")),
    "ResetSession": _owned_request(pb.ResetSessionRequest, reason=text("", "/new")),
    "AppendEvents": lambda seed: request(
        message(
            pb.AppendEventsRequest,
            base=_owned(seed),
            agent=AGENT,
            session_id=_session(seed),
            expected_version=Field(st.one_of(st.just(OMIT), st.integers(0, 12)), uint64().hostile),
            events=_event_inputs(seed),
            state_deltas=repeated(STATE_DELTA, max_valid=2),
        )
    ),
    "PostToInbox": _owned_request(
        pb.PostToInboxRequest,
        message=MESSAGE,
        mark_resumable=boolean(),
        resume_holder=text("", "gw-1"),
    ),
    "GetHistory": lambda seed: _owned_request(
        pb.GetHistoryRequest,
        after_sequence=_sequence(seed),
        limit=uint32(0, 1, 2, 1000),
        newest=boolean(),
        include_abandoned=boolean(),
        before_sequence=_sequence(seed),
    )(seed),
    "GetSessionState": _owned_request(pb.GetSessionStateRequest),
    "SnapshotSession": _owned_request(pb.SnapshotSessionRequest),
    "WatchEvents": lambda seed: request(
        message(
            pb.WatchEventsRequest,
            after_sequence=_sequence(seed),
            agent=text("", "main", "helper", "ghost"),
            session_id=text("", seed.session_id, seed.helper_session_id, "s_unknown"),
        )
    ),
    "CreateCheckpoint": lambda seed: request(
        message(
            pb.CreateCheckpointRequest,
            label=text(
                strategy=st.one_of(
                    st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True), st.just("cp-1")
                )
            ),
        )
    ),
    "ListCheckpoints": lambda seed: empty_request(pb.ListCheckpointsRequest),
    "Rewind": _rewind,
    "Checkout": lambda seed: request(message(pb.CheckoutRequest, sequence=_sequence(seed))),
    "TruncateLog": lambda seed: request(
        message(pb.TruncateLogRequest, below_sequence=_sequence(seed))
    ),
    "ForkSession": lambda seed: _owned_request(
        pb.ForkSessionRequest, at_sequence=_sequence(seed), narrowing=optional(NARROWING)
    )(seed),
    "Delegate": lambda seed: request(
        message(
            pb.DelegateRequest,
            base=st.just({"agent": "main", "session_id": seed.session_id}),
            agent=AGENT,
            session_id=_session(seed),
            to_agent=text("helper", "helper", "main", "ghost"),
            task=MESSAGE,
            context=text("", "research", "a:b"),
        )
    ),
    "SendToPeer": _send_to_peer,
    "CheckPermission": _owned_request(
        pb.CheckPermissionRequest,
        action=text("fs.read", "fs.write", "peer.send", "memory.write"),
        resource=text("workspace:docs/a.md", "workspace:secret/x", "agent:helper", ""),
    ),
    "MarkResumable": _owned_request(
        pb.MarkResumableRequest,
        pending=boolean(),
        holder=text("", "gw-1", "0123456789abcdef0123456789abcdef"),
    ),
    "SuspendSession": _owned_request(pb.SuspendSessionRequest, suspended=boolean()),
    "ListResumable": lambda seed: request(message(pb.ListResumableRequest, agent=AGENT)),
    "ExpireResumable": lambda seed: request(message(pb.ExpireResumableRequest, agent=AGENT)),
    "ListLogEvents": lambda seed: request(
        message(
            pb.ListLogEventsRequest,
            after_sequence=_sequence(seed),
            before_sequence=_sequence(seed),
            agent=text("", "main", "helper", "ghost"),
            session_id=text("", seed.session_id, "s_unknown"),
            page_size=uint32(0, 1, 2, 1000),
        )
    ),
    "RecordOperatorAction": lambda seed: request(
        message(
            pb.RecordOperatorActionRequest,
            base=st.just({"action": "delivery.retry"}),
            action=text("delivery.retry", "console.rewind"),
            subject=text("", "obligation 0123"),
            detail=text("", "retried by hand"),
        )
    ),
    "RetractMessages": lambda seed: _owned_request(
        pb.RetractMessagesRequest,
        newest_count=uint32(1, 2, 100),
        sequences=sequences(seed),
        expected_version=optional(uint64(0, 3, 5)),
    )(seed),
    "UpdateState": _owned_request(
        pb.UpdateStateRequest, deltas=repeated(STATE_DELTA, min_valid=1, max_valid=2)
    ),
    "GetUserState": lambda seed: request(
        message(pb.GetUserStateRequest, agent=AGENT, user_id=text("alice", "org:7"))
    ),
    "PutRecords": _owned_request(
        pb.PutRecordsRequest, records=repeated(STORED_RECORD, min_valid=1), versioned=boolean()
    ),
    "GetRecord": _owned_request(
        pb.GetRecordRequest,
        kind=RECORD_KIND,
        namespace=text("", "child:1"),
        key=text("", "c1"),
        children_kind=text("", "writes"),
    ),
    "ListRecords": _owned_request(
        pb.ListRecordsRequest,
        kind=RECORD_KIND,
        namespace=optional(text("", "child:1")),
        keys=string_list(text("c1", "c2"), [], ["c1"]),
        labels=repeated(LABEL_FILTER, max_valid=1),
        metadata_filter=string_map(KEY, JSON_VALUE, {}, {"step": "1"}),
        include_payloads=boolean(),
        page_size=uint32(0, 1, 1000),
    ),
    "EraseSession": _owned_request(pb.EraseSessionRequest),
    "EraseRecords": _owned_request(
        pb.EraseRecordsRequest,
        kind=RECORD_KIND,
        keys=string_list(text("c1", "c2"), ["c1"]),
        children_kind=text("", "writes"),
    ),
}


REQUESTS["CallStream"] = lambda seed: carried_calls(pb.CallStreamRequest, SERVICE, REQUESTS, seed)

#: RPCs that never write, whatever they answer.
READ_ONLY: Final = frozenset(
    {
        "GetAgent",
        "ListAgents",
        "GetSession",
        "ListSessions",
        "GetHistory",
        "GetSessionState",
        "WatchEvents",
        "ListCheckpoints",
        "ListResumable",
        "ListLogEvents",
        "GetUserState",
        "GetRecord",
        "ListRecords",
    }
)
#: Gated RPCs: a refusal is committed as a permission_checked audit event (by design).
AUDITED_REFUSALS: Final = frozenset({"Delegate", "SendToPeer"})


# -- what an accepted request may have stored -------------------------------------------------

_AGENT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
_SESSION_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_LABEL = re.compile(r"[\w.:-]{1,128}")
_PLATFORM = re.compile(r"[a-z][a-z0-9_]{0,31}")
#: At most 128 characters; no "/", "\\", "..", drive prefix or control characters.
_HOLDER = re.compile(r"(?![A-Za-z]:)(?!.*\.\.)[^/\\\x00-\x1f\x7f-\x9f]{0,128}", re.DOTALL)


def accepted_problems(rpc: str, response: Message) -> list[str]:
    """Names the server accepted must follow the rules the protos state for them."""
    values: list[tuple[str, str, re.Pattern[str]]] = []
    if isinstance(response, pb.CreateAgentResponse):
        values.append(("agent.name", response.agent.name, _AGENT_NAME))
    elif isinstance(response, pb.SpawnSessionResponse):
        values.append(("session.session_id", response.session.session_id, _SESSION_ID))
    elif isinstance(response, pb.CreateCheckpointResponse):
        values.append(("checkpoint.label", response.checkpoint.label, _LABEL))
    elif isinstance(response, pb.MarkResumableResponse):
        values.append(("session.resume_holder", response.session.resume_holder, _HOLDER))
    elif isinstance(response, pb.ResolveSessionResponse) and response.session.source.transport:
        values.append(("session.source.transport", response.session.source.transport, _PLATFORM))
    return [
        f"{rpc} accepted {name}={value!r}, which breaks its documented syntax"
        for name, value, pattern in values
        if not pattern.fullmatch(value)
    ]


# -- the database -------------------------------------------------------------------------------

TABLES: Final = (
    "session_log_head",
    "session_log",
    "session_agent",
    "session_session",
    "session_route",
    "session_snapshot",
    "session_rewind",
    "session_checkpoint",
    "session_retention",
    *FRAMEWORK_TABLES,
)
Rows = dict[str, list[tuple[Any, ...]]]


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def rows(service: InProcessSession) -> Rows:
    """Every row of every session table (the log head among them)."""
    store = service.unit.store
    with store.database.connection_context():
        head = store.log.head()
        dumped = {
            table: sorted(
                (
                    tuple(_plain(v) for v in row)
                    for row in store.database.execute_sql(f"SELECT * FROM {table}").fetchall()
                ),
                key=repr,
            )
            for table in TABLES
        }
    dumped["head"] = [(head,)]
    return dumped


def check_nothing_written(
    rpc: str, request: Message, answer: Answer, before: Rows, after: Rows
) -> None:
    changed = sorted(table for table in before if before[table] != after[table])
    code = answer.error.code() if answer.error is not None else None
    if rpc in AUDITED_REFUSALS and code == grpc.StatusCode.PERMISSION_DENIED:
        new = set(after["session_log"]) - set(before["session_log"])
        kinds = sorted(str(row[3]) for row in new)
        assert kinds == ["permission_checked"], f"{rpc} refusal logged {kinds}"
        assert after["head"][0][0] == before["head"][0][0] + 1
        assert set(changed) <= {"head", "session_log_head", "session_log", "session_session"}, (
            f"{rpc} refusal changed {changed}"
        )
        return
    outcome = "OK" if code is None else code.name
    assert not changed, (
        f"{rpc} answered {outcome} but changed {changed}\nrequest: {describe(request)}"
    )


# -- known server bugs ------------------------------------------------------------------------


BUGS: Final = (
    KnownBug(
        name="error-message-echoes-request",
        rpc="UpdateAgent",
        reason="error messages quote request text without a bound (UpdateAgent's update_mask "
        "path, Rewind's checkpoint label, ...); the message and its BadRequest copy exceed "
        "gRPC's 16 KiB metadata limit and the client gets RESOURCE_EXHAUSTED 'received "
        "metadata size exceeds hard limit' with no ErrorInfo; expected INVALID_ARGUMENT "
        "update_mask with a cut message",
        backends=("sqlite", "postgres"),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.UpdateAgentRequest(
            agent=pb.Agent(name="main"),
            update_mask=field_mask_pb2.FieldMask(paths=["\N{GRINNING FACE}" * 2000]),
        ),
        expected=grpc.StatusCode.INVALID_ARGUMENT,
    ),
    KnownBug(
        name="sub-agent-refusal-echoes-peers",
        rpc="CreateAgent",
        reason="CreateAgent of a sub-agent with 1500 peers its parent lacks: the "
        "EXCEEDS_PARENT message lists every peer, the trailers exceed gRPC's metadata limit "
        "and the client gets RESOURCE_EXHAUSTED without ErrorInfo; expected "
        "FAILED_PRECONDITION EXCEEDS_PARENT with a cut message",
        backends=("sqlite", "postgres"),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.CreateAgentRequest(
            agent=pb.Agent(
                name="kid", parent="main", peers=[f"peer-number-{i}" for i in range(1500)]
            )
        ),
        expected=grpc.StatusCode.FAILED_PRECONDITION,
    ),
    KnownBug(
        name="sub-agent-refusal-echoes-resource",
        rpc="CreateAgent",
        reason="CreateAgent of a sub-agent with an allow rule of a 254-character action on a "
        "1024-emoji resource (both within their limits): the EXCEEDS_PARENT message quotes "
        "them and the client gets RESOURCE_EXHAUSTED without ErrorInfo; expected "
        "FAILED_PRECONDITION EXCEEDS_PARENT",
        backends=("sqlite", "postgres"),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.CreateAgentRequest(
            agent=pb.Agent(
                name="kid",
                parent="main",
                permissions=[
                    pb.PermissionRule(
                        effect=pb.PERMISSION_EFFECT_ALLOW,
                        action="net." + "\N{GRINNING FACE}" * 250,
                        resource="\N{GRINNING FACE}" * 1024,
                    )
                ],
            )
        ),
        expected=grpc.StatusCode.FAILED_PRECONDITION,
    ),
    KnownBug(
        name="rewind-unknown-label-echoed",
        rpc="Rewind",
        reason="Rewind(checkpoint=<20000 characters>) answers RESOURCE_EXHAUSTED (the "
        "NOT_FOUND message quotes the whole label, beyond gRPC's metadata limit); expected "
        "NOT_FOUND CHECKPOINT_NOT_FOUND (or INVALID_ARGUMENT for an over-long label)",
        backends=("sqlite", "postgres"),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.RewindRequest(checkpoint="a" * 20_000),
        expected=grpc.StatusCode.INVALID_ARGUMENT,
    ),
    KnownBug(
        name="chat-routing-key-over-512",
        rpc="ResolveSession",
        reason="each chat id may be 256 characters, but session_route.routing_key is "
        "varchar(512): on Postgres a channel source with long scope/chat/thread/user ids is "
        "INTERNAL (value too long); expected the session (as on SQLite) or INVALID_ARGUMENT",
        backends=("postgres",),
        fixed=True,
        matches=None,
        expected=grpc.StatusCode.INVALID_ARGUMENT,
        repro=lambda seed: pb.ResolveSessionRequest(
            agent="main",
            source=pb.Source(
                transport="slack",
                chat_type=pb.CHAT_TYPE_CHANNEL,
                scope_id="T" * 256,
                chat_id="C" * 256,
                thread_id="1" * 256,
                user_id="U" * 256,
            ),
        ),
    ),
    KnownBug(
        name="rewind-checkpoint-nul",
        rpc="Rewind",
        reason="Rewind's checkpoint label is not validated; on Postgres a label with NUL "
        "reaches the query and fails with INTERNAL; expected NOT_FOUND (as on SQLite) or "
        "INVALID_ARGUMENT checkpoint",
        backends=("postgres",),
        fixed=True,
        matches=None,
        repro=lambda seed: pb.RewindRequest(checkpoint="cp\x00"),
        expected=grpc.StatusCode.INVALID_ARGUMENT,
    ),
)


def test_every_rpc_has_a_request_strategy() -> None:
    check_request_table(REQUESTS, SERVICE, READ_ONLY | AUDITED_REFUSALS | {bug.rpc for bug in BUGS})


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_fuzzed_requests_answer_clearly_and_rejections_write_nothing(
    rpc: str, database_url: str, loop_thread: EventLoopThread
) -> None:
    backend = backend_of(database_url)
    method = SERVICE.methods_by_name[rpc]
    with session_server(loop_thread, database_url) as service:
        fuzz_rpc(
            service.stub,
            rpc,
            method,
            REQUESTS[rpc](seed(service.stub)),
            bugs=BUGS,
            backend=backend,
            read_only=READ_ONLY,
            snapshot=lambda: rows(service),
            nothing_written=check_nothing_written,
            accepted_problems=accepted_problems,
        )


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.name)
def test_known_bug(
    bug: KnownBug,
    database_url: str,
    loop_thread: EventLoopThread,
    request: pytest.FixtureRequest,
) -> None:
    """Each server bug the fuzzer found, reproduced minimally: a strict xfail where it
    shows while open, a regression test once fixed."""
    mark_if_open(bug, backend_of(database_url), request)
    with session_server(loop_thread, database_url) as service:
        repro = bug.repro(seed(service.stub))
        check_repro(bug, service.stub, SERVICE.methods_by_name[bug.rpc], repro)
