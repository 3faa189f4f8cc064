"""Sub-agents never hold more than their ancestors (issue 12, item 3): every write is
bounded, and every decision evaluates each ancestor's current rules too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from itertools import product
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2
from hypothesis import given
from hypothesis import strategies as st

from session_service import permissions
from switchboard.auth import parse_tokens
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import as_record, create_agent, resolve, web
from tests.status import error_details, error_reason

ALLOW, DENY = pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY


def rule(effect: Any, action: str, resource: str = "*") -> pb.PermissionRule:
    return pb.PermissionRule(effect=effect, action=action, resource=resource)


def update(
    stub: pb_grpc.SessionServiceStub, name: str, paths: list[str], **fields: Any
) -> pb.Agent:
    return stub.UpdateAgent(
        pb.UpdateAgentRequest(
            agent=pb.Agent(name=name, **fields),
            update_mask=field_mask_pb2.FieldMask(paths=paths),
        )
    ).agent


def refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, str, str, str]:
    """The code, reason, field (from ErrorInfo metadata) and message of a refusal."""
    with pytest.raises(grpc.RpcError) as raised:
        call()
    info, _ = error_details(raised.value)
    details = raised.value.details() or ""
    return raised.value.code(), info.reason, info.metadata.get("field", ""), details


def check(stub: pb_grpc.SessionServiceStub, agent: str, action: str, resource: str) -> Any:
    session_id = resolve(stub, agent, **web()).session.session_id
    return stub.CheckPermission(
        pb.CheckPermissionRequest(
            agent=agent, session_id=session_id, action=action, resource=resource
        )
    ).decision


def log_head(service: InProcessSession) -> int:
    store: Any = service.unit.store
    with store.database.connection_context():
        return int(store.log.head())


@pytest.fixture
def lead(service: InProcessSession) -> InProcessSession:
    """The issue's setting: `lead` denies writing docs/secret.txt, reaches `helper` only."""
    for name in ("helper", "stranger"):
        create_agent(service.stub, name)
    create_agent(
        service.stub,
        "lead",
        peers=["helper"],
        permissions=[
            rule(ALLOW, "fs.*", "*"),
            rule(DENY, "fs.write", "workspace:docs/secret.txt"),
        ],
    )
    create_agent(
        service.stub, "sub", parent="lead", peers=["helper"], permissions=[rule(ALLOW, "fs.read")]
    )
    return service


# -- the attack ---------------------------------------------------------------------


def test_update_agent_cannot_widen_a_sub_agent_past_its_parent(lead: InProcessSession) -> None:
    stub = lead.stub
    before, head = stub.GetAgent(pb.GetAgentRequest(name="sub")).agent, log_head(lead)
    wide = [rule(ALLOW, "fs.*", "*"), rule(ALLOW, "shell.run", "*")]
    code, reason, field, message = refused(
        lambda: update(stub, "sub", ["permissions"], permissions=wide)
    )
    assert (code, reason, field) == (
        grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT", "agent.permissions[1]",
    )  # fmt: skip
    assert "shell.run" in message and "'lead'" in message
    code, reason, field, _ = refused(
        lambda: update(stub, "sub", ["peers"], peers=["helper", "stranger"])
    )
    assert (code, reason, field) == (
        grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT", "agent.peers[1]",
    )  # fmt: skip
    assert stub.GetAgent(pb.GetAgentRequest(name="sub")).agent == before
    assert log_head(lead) == head, "a refused update writes nothing"


def test_replacing_a_sub_agents_rules_keeps_its_parents_denials(lead: InProcessSession) -> None:
    stub = lead.stub
    assert (
        rule(DENY, "fs.write", "workspace:docs/secret.txt")
        in stub.GetAgent(pb.GetAgentRequest(name="sub")).agent.permissions
    ), "the copy made at creation"
    replaced = update(stub, "sub", ["permissions"], permissions=[rule(ALLOW, "fs.*", "*")])
    assert list(replaced.permissions) == [rule(ALLOW, "fs.*", "*")], "the copied deny is gone"
    decision = check(stub, "sub", "fs.write", "workspace:docs/secret.txt")
    assert (decision.allowed, decision.rule) == (False, "ancestor[lead][1]")
    assert check(stub, "sub", "fs.write", "workspace:docs/other.txt").allowed


def test_peer_calls_reach_only_what_every_ancestor_reaches(lead: InProcessSession) -> None:
    stub = lead.stub
    session_id = resolve(stub, "sub", **web()).session.session_id
    task = pb.Message(role=pb.ROLE_USER, content="look at this")

    def delegate(to: str) -> pb.DelegateResponse:
        return stub.Delegate(
            pb.DelegateRequest(agent="sub", session_id=session_id, to_agent=to, task=task)
        )

    assert delegate("helper").created
    update(stub, "lead", ["peers"], peers=[])  # the parent loses helper: so does sub, at once
    code, reason, _, message = refused(lambda: delegate("helper"))
    assert (code, reason) == (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED")
    assert "ancestor[lead]" in message
    code, _, _, message = refused(  # SendToPeer passes the same gate
        lambda: stub.SendToPeer(
            pb.SendToPeerRequest(
                agent="sub", session_id=session_id, to_agent="helper",
                source=pb.Source(transport="peer", conversation_id="sub:x"), message=task,
            )
        )
    )  # fmt: skip
    assert code == grpc.StatusCode.PERMISSION_DENIED and "ancestor[lead]" in message


# -- decisions follow the ancestors' current rules -----------------------------------------


def test_narrowing_the_parent_narrows_the_child_at_once(lead: InProcessSession) -> None:
    stub = lead.stub
    decision = check(stub, "sub", "fs.read", "workspace:notes.md")
    assert (decision.allowed, decision.rule) == (True, "agent[0]")
    update(stub, "lead", ["permissions"], permissions=[rule(ALLOW, "fs.write", "*")])
    decision = check(stub, "sub", "fs.read", "workspace:notes.md")
    assert (decision.allowed, decision.rule) == (False, "")
    assert "no ancestor[lead] rule allows fs.read" in decision.reason
    update(stub, "lead", ["permissions", "peers"], permissions=[], peers=[])
    assert not check(stub, "sub", "fs.read", "workspace:notes.md").allowed, (
        "a parent allowed nothing leaves its sub-agent nothing"
    )
    update(stub, "lead", ["permissions"], permissions=[rule(ALLOW, "fs.*")])
    assert check(stub, "sub", "fs.read", "workspace:notes.md").allowed, "widened back"
    stub.DeleteAgent(pb.DeleteAgentRequest(name="lead"))
    decision = check(stub, "sub", "fs.read", "workspace:notes.md")
    assert not decision.allowed and "ancestor 'lead' is archived" in decision.reason


def test_a_grandchild_is_bound_by_its_grandparent(service: InProcessSession) -> None:
    stub = service.stub
    create_agent(
        stub,
        "top",
        workspace_root="/srv/top",
        permissions=[rule(ALLOW, "fs.*", "workspace:*"), rule(ALLOW, "net.fetch", "https://*")],
    )
    create_agent(
        stub,
        "mid",
        parent="top",
        workspace_root="/srv/top/team",
        permissions=[rule(ALLOW, "fs.*", "workspace:*"), rule(ALLOW, "net.fetch", "https://*")],
    )
    create_agent(stub, "leaf", parent="mid", permissions=[rule(ALLOW, "fs.*", "workspace:*")])
    # The leaf works in mid's root (it has none of its own): workspace:a.txt is
    # /srv/top/team/a.txt, which top judges as its workspace:team/a.txt.
    assert check(stub, "leaf", "fs.write", "workspace:a.txt").allowed
    update(
        stub,
        "top",
        ["permissions"],
        permissions=[
            rule(ALLOW, "fs.*", "workspace:*"),
            rule(DENY, "fs.write", "workspace:team/a.txt"),
        ],
    )
    decision = check(stub, "leaf", "fs.write", "workspace:a.txt")
    assert (decision.allowed, decision.rule) == (False, "ancestor[top][1]")
    decision = check(stub, "leaf", "fs.read", "workspace:../../other/x")
    assert not decision.allowed and "escapes" in decision.reason
    # mid still allows net.fetch; top no longer does: the leaf may not take it.
    code, reason, field, message = refused(
        lambda: update(
            stub, "leaf", ["permissions"], permissions=[rule(ALLOW, "net.fetch", "https://*")]
        )
    )
    assert (code, reason, field) == (
        grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT", "agent.permissions[0]",
    )  # fmt: skip
    assert "ancestor 'top'" in message
    code, reason, field, _ = refused(
        lambda: update(stub, "leaf", ["workspace_root"], workspace_root="/srv/elsewhere")
    )
    assert (code, reason, field) == (
        grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT", "agent.workspace_root",
    )  # fmt: skip
    narrower = update(stub, "leaf", ["workspace_root"], workspace_root="/srv/top/team/docs")
    assert narrower.workspace_root == "/srv/top/team/docs"


def test_memory_writes_pass_every_ancestors_gate(service: InProcessSession) -> None:
    stub = service.stub
    create_agent(
        stub,
        "lead",
        permissions=[
            rule(ALLOW, "memory.write", "memory:*"),
            rule(DENY, "memory.write", "memory:sys.*"),
        ],
    )
    code, reason, _, _ = refused(
        lambda: create_agent(
            stub, "sub", parent="lead", permissions=[rule(ALLOW, "memory.write", "*")]
        )
    )
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT")
    create_agent(stub, "sub", parent="lead")
    own_rules = [rule(ALLOW, "memory.write", "memory:*")]  # without the deny copied from lead
    update(stub, "sub", ["permissions"], permissions=own_rules)
    stub.PutMemory(pb.PutMemoryRequest(agent="sub", key="notes", value="x"))
    code, _, _, message = refused(
        lambda: stub.PutMemory(pb.PutMemoryRequest(agent="sub", key="sys.prompt", value="x"))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "denied by rule" in message
    create_agent(stub, "silent", parent="lead")
    update(stub, "silent", ["permissions"], permissions=[])  # its rules say nothing of memory
    code, _, _, message = refused(
        lambda: stub.PutMemory(pb.PutMemoryRequest(agent="silent", key="notes", value="x"))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED, "lead's rules gate its sub-agents' memory"
    stub.DeleteAgent(pb.DeleteAgentRequest(name="lead"))
    for call in (
        lambda: stub.PutMemory(pb.PutMemoryRequest(agent="sub", key="notes", value="y")),
        lambda: stub.DeleteMemory(pb.DeleteMemoryRequest(agent="sub", key="notes")),
        lambda: update(stub, "sub", ["display_name"], display_name="Orphan"),
    ):
        code, reason, _, _ = refused(call)
        assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PARENT_ARCHIVED")
    assert dict(stub.GetAgent(pb.GetAgentRequest(name="sub")).agent.memory) == {"notes": "x"}


# -- re-parenting ---------------------------------------------------------------------------


def test_re_parenting_is_bounded_by_the_new_parent(lead: InProcessSession) -> None:
    stub = lead.stub
    create_agent(stub, "reader", permissions=[rule(ALLOW, "fs.read")], peers=["helper"])
    create_agent(stub, "writer", parent="lead", permissions=[rule(ALLOW, "fs.write")])
    code, reason, field, message = refused(
        lambda: update(stub, "writer", ["parent"], parent="reader")  # permissions untouched
    )
    assert (code, reason, field) == (
        grpc.StatusCode.FAILED_PRECONDITION, "EXCEEDS_PARENT", "agent.permissions[0]",
    )  # fmt: skip
    assert "ancestor 'reader'" in message
    moved = update(stub, "sub", ["parent"], parent="reader")
    assert moved.parent == "reader"
    assert check(stub, "sub", "fs.read", "workspace:docs/secret.txt").allowed
    assert update(stub, "sub", ["parent"], parent="").parent == "", "a sub-agent no more"


def test_re_parenting_refuses_cycles_depth_and_dead_parents(service: InProcessSession) -> None:
    stub = service.stub
    create_agent(stub, "a0", permissions=[rule(ALLOW, "*")])
    for depth in range(1, permissions.MAX_DEPTH + 1):
        create_agent(stub, f"a{depth}", parent=f"a{depth - 1}", permissions=[rule(ALLOW, "*")])
    deepest = f"a{permissions.MAX_DEPTH}"  # it has MAX_DEPTH ancestors: the limit
    assert check(stub, deepest, "fs.read", "x").allowed
    head = log_head(service)
    expected = [
        (lambda: create_agent(stub, "too-deep", parent=deepest), "PARENT_TOO_DEEP"),
        (lambda: update(stub, "a0", ["parent"], parent="a3"), "PARENT_CYCLE"),
        (lambda: update(stub, "a2", ["parent"], parent="a2"), "PARENT_CYCLE"),
        (lambda: update(stub, "a2", ["parent"], parent="ghost"), "PARENT_NOT_FOUND"),
        (lambda: create_agent(stub, "orphan", parent="ghost"), "PARENT_NOT_FOUND"),
    ]
    for call, reason in expected:
        code, got, field, _ = refused(call)
        assert (code, got, field) == (grpc.StatusCode.FAILED_PRECONDITION, reason, "agent.parent")
    create_agent(stub, "gone")
    stub.DeleteAgent(pb.DeleteAgentRequest(name="gone"))
    head = log_head(service)
    code, reason, _, _ = refused(lambda: update(stub, "a2", ["parent"], parent="gone"))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PARENT_ARCHIVED")
    assert log_head(service) == head
    assert stub.GetAgent(pb.GetAgentRequest(name="a2")).agent.parent == "a1"


# -- the rules as functions -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("inner", "outer", "within"),
    [
        ("fs.read", "fs.*", True),
        ("fs.*", "fs.*", True),
        ("fs.[rw]*", "fs.*", True),
        ("a*b*c", "a*c", True),
        ("workspace:docs/*", "workspace:*", True),
        ("*", "fs.*", False),
        ("workspace:*", "workspace:docs/*", False),
        ("fs.*", "fs.?", False),  # fnmatch("fs.*", "fs.?") is true: the old check's hole
        ("fs.*", "fs.[*]", False),
        ("fs.?", "fs.[ab]", False),
        ("fs.a", "fs.[ab]", True),
    ],
)
def test_glob_containment(inner: str, outer: str, within: bool) -> None:
    assert permissions.glob_within(inner, outer) is within


_PATTERN = st.lists(st.sampled_from(["a", "b", "*", "?", "[ab]", "[!a]"]), max_size=4).map("".join)
_WORDS = ["".join(letters) for n in range(5) for letters in product("abc", repeat=n)]


@given(inner=_PATTERN, outer=_PATTERN)
def test_glob_containment_never_accepts_a_wider_pattern(inner: str, outer: str) -> None:
    if permissions.glob_within(inner, outer):
        escaping = [w for w in _WORDS if fnmatchcase(w, inner) and not fnmatchcase(w, outer)]
        assert not escaping, f"{inner!r} within {outer!r}, but {escaping[0]!r}"


def test_a_broken_lineage_is_allowed_nothing() -> None:
    child = as_record(pb.Agent(name="c", parent="p", permissions=[rule(ALLOW, "*")]))
    looped = {
        "p": as_record(pb.Agent(name="p", parent="q")),
        "q": as_record(pb.Agent(name="q", parent="p")),
    }
    lineage = permissions.ancestry(child, looped.get)
    assert lineage.reason == "PARENT_CYCLE"
    decision = permissions.decide(child, [], "fs.read", "x", lineage)
    assert not decision.allowed and "its own ancestor" in decision.reason


# -- session-side scoping with tokens --------------------------------------------------------

ADMIN, MAIN, CODER = "admin-token", "main-token", "coder-token"


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def secured(
    database_url: str, loop_thread: EventLoopThread
) -> Iterator[pb_grpc.SessionServiceStub]:
    grants = parse_tokens(f"{ADMIN}=admin;{MAIN}=agents:main;{CODER}=agents:coder")
    with session_server(loop_thread, database_url, auth=grants) as service:
        for name in ("main", "coder"):
            service.stub.CreateAgent(
                pb.CreateAgentRequest(
                    agent=pb.Agent(name=name, peers=[name], permissions=[rule(ALLOW, "*")])
                ),
                metadata=_as(ADMIN),
            )
        yield service.stub


def test_agent_tokens_spawn_only_in_their_agents_namespace(
    secured: pb_grpc.SessionServiceStub,
) -> None:
    def spawn(session_id: str, token: str = MAIN) -> pb.Session:
        request = pb.SpawnSessionRequest(agent="main", session_id=session_id)
        return secured.SpawnSession(request, metadata=_as(token)).session

    for chosen in ("nightly", "coder.nightly", "main.", "mainx.nightly"):
        with pytest.raises(grpc.RpcError) as raised:
            spawn(chosen)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_details(raised.value)[1] == ["session_id"]
        assert error_reason(raised.value) == "SESSION_ID_NAMESPACE"
    assert spawn("main.nightly").session_id == "main.nightly"
    assert spawn("").session_id.startswith("s_"), "a generated id needs no namespace"
    assert spawn("anything", token=ADMIN).session_id == "anything", "admins choose any id"


def test_checkpoints_are_admin_only(secured: pb_grpc.SessionServiceStub) -> None:
    secured.CreateCheckpoint(pb.CreateCheckpointRequest(label="cut"), metadata=_as(ADMIN))
    with pytest.raises(grpc.RpcError) as raised:
        secured.ListCheckpoints(pb.ListCheckpointsRequest(), metadata=_as(MAIN))
    assert raised.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert error_reason(raised.value) == "ADMIN_ONLY"
    listed = secured.ListCheckpoints(pb.ListCheckpointsRequest(), metadata=_as(ADMIN))
    assert [c.label for c in listed.checkpoints] == ["cut"]


def _session_calls(session_id: str, main_session: str) -> dict[str, Callable[[Any], Any]]:
    """Every call by `main` that names `session_id` (main's own session is `main_session`)."""
    own: dict[str, Any] = {"agent": "main", "session_id": session_id}
    message = pb.Message(role=pb.ROLE_USER, content="hi")
    appended = pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))
    return {
        "ResolveSession": lambda s: s.ResolveSession(pb.ResolveSessionRequest(**own)),
        "GetSession": lambda s: s.GetSession(pb.GetSessionRequest(**own)),
        "EndSession": lambda s: s.EndSession(pb.EndSessionRequest(**own)),
        "ResetSession": lambda s: s.ResetSession(pb.ResetSessionRequest(**own)),
        "AppendEvents": lambda s: s.AppendEvents(
            pb.AppendEventsRequest(**own, events=[appended], expected_version=1)
        ),
        "PostToInbox": lambda s: s.PostToInbox(pb.PostToInboxRequest(**own, message=message)),
        "GetHistory": lambda s: s.GetHistory(pb.GetHistoryRequest(**own)),
        "GetSessionState": lambda s: s.GetSessionState(pb.GetSessionStateRequest(**own)),
        "SnapshotSession": lambda s: s.SnapshotSession(pb.SnapshotSessionRequest(**own)),
        "ForkSession": lambda s: s.ForkSession(pb.ForkSessionRequest(**own)),
        "CheckPermission": lambda s: s.CheckPermission(
            pb.CheckPermissionRequest(**own, action="fs.read", resource="x")
        ),
        "MarkResumable": lambda s: s.MarkResumable(pb.MarkResumableRequest(**own, pending=True)),
        "SuspendSession": lambda s: s.SuspendSession(
            pb.SuspendSessionRequest(**own, suspended=True)
        ),
        "SpawnSession": lambda s: s.SpawnSession(pb.SpawnSessionRequest(**own)),
        "SendToPeer": lambda s: s.SendToPeer(
            pb.SendToPeerRequest(
                agent="main",
                session_id=main_session,
                to_agent="main",
                to_session_id=session_id,
                message=message,
            )
        ),
    }


def test_another_agents_session_answers_exactly_as_a_missing_one(
    secured: pb_grpc.SessionServiceStub,
) -> None:
    coder = _as(CODER)
    for spawned in ("coder.open", "coder.ended"):
        secured.SpawnSession(
            pb.SpawnSessionRequest(agent="coder", session_id=spawned), metadata=coder
        )
    secured.EndSession(
        pb.EndSessionRequest(agent="coder", session_id="coder.ended"), metadata=coder
    )
    as_main = _Scoped(secured, _as(MAIN))
    main_session = as_main.ResolveSession(
        pb.ResolveSessionRequest(agent="main", source=pb.Source(**web()))
    ).session.session_id
    answers: dict[str, set[tuple[Any, ...]]] = {}
    for session_id in ("coder.open", "coder.ended", "coder.missing"):
        for name, call in _session_calls(session_id, main_session).items():
            with pytest.raises(grpc.RpcError) as raised:
                call(as_main)
            info, fields = error_details(raised.value)
            message = (raised.value.details() or "").replace(session_id, "<id>")
            answers.setdefault(name, set()).add(
                (raised.value.code(), info.reason, tuple(fields), message)
            )
    for name, seen in answers.items():
        assert len(seen) == 1, f"{name} tells coder's sessions from missing ones: {seen}"
        [(code, *_)] = seen
        expected = "INVALID_ARGUMENT" if name == "SpawnSession" else "NOT_FOUND"
        assert code.name == expected, f"{name}: {seen}"
    state = secured.GetSessionState(
        pb.GetSessionStateRequest(agent="coder", session_id="coder.open"), metadata=coder
    ).state
    assert not state.inbox and not state.session.suspended, "coder's session is untouched"


class _Scoped:
    """A stub whose every call carries one token's metadata."""

    def __init__(self, stub: pb_grpc.SessionServiceStub, metadata: Any) -> None:
        self._stub, self._metadata = stub, metadata

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)
        return lambda request: method(request, metadata=self._metadata)
