"""The permission gate, forks, sub-agents, delegation and peer messages."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from session_service import permissions, records
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import append, as_record, create_agent, resolve, user_message, web
from tests.status import error_reason

ALLOW, DENY = pb.PERMISSION_EFFECT_ALLOW, pb.PERMISSION_EFFECT_DENY


def rule(effect: Any, action: str, resource: str = "*") -> pb.PermissionRule:
    return pb.PermissionRule(effect=effect, action=action, resource=resource)


AGENT = pb.Agent(
    name="main",
    workspace_root="/srv/main",
    permissions=[
        rule(ALLOW, "fs.*", "workspace:*"),
        rule(DENY, "fs.write", "workspace:secrets/*"),
        rule(ALLOW, "net.fetch", "https://*"),
    ],
)


@pytest.mark.parametrize(
    ("action", "resource", "narrowing", "allowed", "decided_by"),
    [
        ("fs.read", "workspace:docs/a.md", [], True, "agent[0]"),
        ("fs.write", "workspace:secrets/key", [], False, "agent[1]"),
        ("shell.run", "ls", [], False, ""),
        ("fs.read", "workspace:docs/a.md", [[rule(DENY, "fs.read")]], False, "narrowing[0][0]"),
        ("fs.read", "workspace:docs/a.md", [[rule(ALLOW, "fs.read")]], True, "agent[0]"),
        ("net.fetch", "https://x.org", [[rule(ALLOW, "fs.read")]], False, ""),
        (
            "fs.read",
            "workspace:docs/a.md",
            [[rule(ALLOW, "fs.*")], [rule(ALLOW, "fs.read", "workspace:src/*")]],
            False,
            "",
        ),
    ],
)
def test_decisions(
    action: str, resource: str, narrowing: list[list[Any]], allowed: bool, decided_by: str
) -> None:
    layers = [as_record(pb.Narrowing(rules=layer)) for layer in narrowing]
    decision = permissions.decide(as_record(AGENT), layers, action, resource)
    assert (decision.allowed, decision.rule) == (allowed, decided_by)


@pytest.mark.parametrize(
    "resource",
    [
        "workspace:../other/file",
        "workspace:docs/../../etc/passwd",
        "workspace:/etc/passwd",
        "workspace:docs\\..\\..\\x",
        "workspace:~/x",
        "workspace:a\x00b",
    ],
)
def test_paths_escaping_the_workspace_are_denied(resource: str) -> None:
    decision = permissions.decide(as_record(AGENT), [], "fs.read", resource)
    assert not decision.allowed and "escapes the workspace" in decision.reason


def test_workspace_paths_are_normalized_before_matching() -> None:
    agent = as_record(AGENT)
    assert permissions.decide(agent, [], "fs.read", "workspace:docs/./a/../b.md").allowed
    assert not permissions.decide(agent, [], "fs.write", "workspace:x/../secrets/k").allowed


@pytest.fixture
def team(service: InProcessSession) -> InProcessSession:
    service.stub.CreateAgent(pb.CreateAgentRequest(agent=AGENT))
    create_agent(service.stub, "coder", permissions=[rule(ALLOW, "fs.*")])
    create_agent(service.stub, "planner", peers=["coder"], permissions=[rule(ALLOW, "fs.*")])
    return service


def _check(service: InProcessSession, session_id: str, action: str, resource: str) -> Any:
    return service.stub.CheckPermission(
        pb.CheckPermissionRequest(
            agent="main", session_id=session_id, action=action, resource=resource
        )
    )


def test_check_permission_is_recorded_and_rewinds(team: InProcessSession) -> None:
    session_id = resolve(team.stub, **web()).session.session_id
    mark = team.stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="cut")).checkpoint.sequence
    answer = _check(team, session_id, "fs.write", "workspace:secrets/k")
    assert not answer.decision.allowed and answer.decision.rule == "agent[1]"
    store: Any = team.unit.store

    def audit() -> list[int]:
        with store.database.connection_context():
            events = store.log.entity_events(f"session:{session_id}", 0)
        return [e.sequence for e in events if isinstance(e.body, records.PermissionChecked)]

    assert audit() == [answer.sequence]
    team.stub.Rewind(pb.RewindRequest(sequence=mark))
    assert audit() == []


def test_fork_branches_history_and_inherits_narrowing(team: InProcessSession) -> None:
    session_id = resolve(team.stub, **web()).session.session_id
    first = append(team.stub, session_id, user_message("a"), user_message("b")).events
    append(team.stub, session_id, user_message("c"))
    fork = team.stub.ForkSession(
        pb.ForkSessionRequest(
            agent="main",
            session_id=session_id,
            at_sequence=first[1].sequence,
            narrowing=pb.Narrowing(rules=[rule(ALLOW, "fs.read")]),
        )
    ).session
    assert fork.lineage.parent_session_id == session_id
    assert fork.lineage.forked_at_sequence == first[1].sequence
    history = team.stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=fork.session_id))
    assert [m.message.content for m in history.messages] == ["a", "b"]
    append(team.stub, fork.session_id, user_message("fork only"))
    parent = team.stub.GetHistory(pb.GetHistoryRequest(agent="main", session_id=session_id))
    assert [m.message.content for m in parent.messages] == ["a", "b", "c"]
    assert _check(team, fork.session_id, "fs.read", "workspace:x").decision.allowed
    assert not _check(team, fork.session_id, "fs.write", "workspace:x").decision.allowed
    grandchild = team.stub.ForkSession(
        pb.ForkSessionRequest(agent="main", session_id=fork.session_id)
    ).session
    assert len(grandchild.narrowing) == 1, "forks inherit the narrowing"
    assert not _check(team, grandchild.session_id, "fs.write", "workspace:x").decision.allowed


def test_sub_agents_may_not_exceed_their_parent(team: InProcessSession) -> None:
    child = team.stub.CreateAgent(
        pb.CreateAgentRequest(
            agent=pb.Agent(
                name="reader", parent="main", permissions=[rule(ALLOW, "fs.read", "workspace:*")]
            )
        )
    ).agent
    assert rule(DENY, "fs.write", "workspace:secrets/*") in child.permissions, "denials inherited"
    with pytest.raises(grpc.RpcError) as refused:
        team.stub.CreateAgent(
            pb.CreateAgentRequest(
                agent=pb.Agent(name="shell", parent="main", permissions=[rule(ALLOW, "shell.*")])
            )
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "EXCEEDS_PARENT"


def test_delegate_opens_then_resumes_a_peer_session_with_lineage(team: InProcessSession) -> None:
    planning = resolve(team.stub, "planner", **web()).session.session_id
    task = pb.Message(role=pb.ROLE_USER, content="write the parser", sender="agent:planner")
    request = pb.DelegateRequest(
        agent="planner", session_id=planning, to_agent="coder", task=task, context="ticket-7"
    )
    first = team.stub.Delegate(request)
    again = team.stub.Delegate(request)
    assert first.created and not again.created
    assert first.session.session_id == again.session.session_id
    assert first.session.agent == "coder"
    assert first.session.routing_key == "agent:coder:peer:from=planner:id=planner%3Aticket-7"
    assert first.session.source.from_agent == "planner"
    assert first.session.lineage.parent_session_id == planning
    assert first.session.lineage.delegated
    state = team.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="coder", session_id=first.session.session_id)
    ).state
    assert [q.message.content for q in state.inbox] == ["write the parser"] * 2


def test_delegating_to_a_non_peer_is_denied_and_audited(team: InProcessSession) -> None:
    session_id = resolve(team.stub, **web()).session.session_id
    with pytest.raises(grpc.RpcError) as refused:
        team.stub.Delegate(
            pb.DelegateRequest(
                agent="main", session_id=session_id, to_agent="coder",
                task=pb.Message(role=pb.ROLE_USER, content="x"),
            )
        )  # fmt: skip
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    listed = team.stub.ListSessions(pb.ListSessionsRequest(agent="coder"))
    assert list(listed.sessions) == [], "nothing was opened"
    store: Any = team.unit.store
    with store.database.connection_context():
        events = store.log.entity_events(f"session:{session_id}", 0)
    denials = [e.body for e in events if isinstance(e.body, records.PermissionChecked)]
    assert [(d.action, d.allowed) for d in denials] == [("peer.delegate", False)]


def test_send_to_peer_by_source_and_by_id(team: InProcessSession) -> None:
    planning = resolve(team.stub, "planner", **web()).session.session_id
    hello = pb.Message(role=pb.ROLE_USER, content="hello", sender="agent:planner")
    by_source = team.stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="planner", session_id=planning, to_agent="coder",
            source=pb.Source(transport="peer", conversation_id="planner:chat"), message=hello,
        )
    ).event  # fmt: skip
    by_id = team.stub.SendToPeer(
        pb.SendToPeerRequest(
            agent="planner", session_id=planning, to_agent="coder",
            to_session_id=by_source.session_id, message=hello,
        )
    ).event  # fmt: skip
    assert by_id.session_id == by_source.session_id
    for unknown in ("s_typo", planning):  # a typo, and another agent's session
        with pytest.raises(grpc.RpcError) as refused:
            team.stub.SendToPeer(
                pb.SendToPeerRequest(
                    agent="planner", session_id=planning, to_agent="coder",
                    to_session_id=unknown, message=hello,
                )
            )  # fmt: skip
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_memory_writes_are_gated_where_the_rules_say_so(service: InProcessSession) -> None:
    create_agent(
        service.stub,
        "main",
        permissions=[
            rule(ALLOW, "memory.write", "memory:*"),
            rule(DENY, "memory.write", "memory:sys.*"),
        ],
    )
    service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key="name", value="Ada"))
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key="sys.prompt", value="x"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    memory = service.stub.GetAgent(pb.GetAgentRequest(name="main")).agent.memory
    assert dict(memory) == {"name": "Ada"}


def test_peer_threads_are_the_senders_redacted_by_either_agent_and_posted_once(
    service: InProcessSession,
) -> None:
    """The three rules of a peer message at once: its thread is the sending agent's
    (from=), its ids are hashed when either agent redacts (the sender here), and a
    message_ref posted again writes nothing, per receiving session."""
    stub = service.stub
    create_agent(stub, "coder")
    create_agent(stub, "router", peers=["coder"], settings=pb.AgentSettings(redact_pii=True))
    create_agent(stub, "mallory", peers=["coder"])
    routing = resolve(stub, "router", **web()).session.session_id
    plotting = resolve(stub, "mallory", **web()).session.session_id

    def send(agent: str, session_id: str, sender: str, **source: Any) -> pb.SendToPeerResponse:
        message = pb.Message(role=pb.ROLE_USER, content=f"from {agent}", sender=sender,
                             message_ref="tg:9:7")  # fmt: skip
        return stub.SendToPeer(
            pb.SendToPeerRequest(
                agent=agent, session_id=session_id, to_agent="coder", message=message,
                source=pb.Source(transport="peer", conversation_id="chat", **source),
            )
        )  # fmt: skip

    first, again = send("router", routing, "u-42"), send("router", routing, "u-42")
    assert (first.duplicate, again.duplicate) == (False, True)
    posted = first.event.inbox_posted.message
    assert posted.sender.startswith("user_") and posted.message_ref.startswith("ref_")
    thread = stub.GetSession(
        pb.GetSessionRequest(agent="coder", session_id=first.event.session_id)
    ).session
    assert thread.routing_key == "agent:coder:peer:from=router:id=chat"
    assert thread.source.from_agent == "router"

    # Another agent naming the same conversation reaches a thread of its own, where the
    # same message_ref is a first post; it cannot claim to be the router.
    other = send("mallory", plotting, "")
    assert other.event.session_id != thread.session_id and not other.duplicate
    assert other.event.inbox_posted.message.sender == "agent:mallory"
    logged = len(stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000)).entries)
    for sender, source, field in (
        ("", {"from_agent": "router"}, "source.from_agent"),
        ("agent:router", {}, "message.sender"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            send("mallory", plotting, sender, **source)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_reason(refused.value) == "PEER_SENDER_MISMATCH"
        assert field in (refused.value.details() or "")
    assert len(stub.ListLogEvents(pb.ListLogEventsRequest(page_size=1000)).entries) == logged

    task = pb.Message(role=pb.ROLE_USER, content="parse", message_ref="ticket-7")
    delegate = pb.DelegateRequest(
        agent="router", session_id=routing, to_agent="coder", task=task, context="t7"
    )
    delegations = [stub.Delegate(delegate) for _ in range(2)]
    assert [(d.created, d.duplicate) for d in delegations] == [(True, False), (False, True)]
    assert delegations[0].session.source.from_agent == "router"
    inbox = stub.GetSessionState(
        pb.GetSessionStateRequest(agent="coder", session_id=delegations[0].session.session_id)
    ).state.inbox
    assert [(q.message.content, q.message.sender) for q in inbox] == [("parse", "agent:router")]
