"""Agents: identity CRUD, memory, field-mask updates, archive; initial state is the first event."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import field_mask_pb2

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import create_agent, resolve, web
from tests.status import error_reason

RULE = pb.PermissionRule(effect=pb.PERMISSION_EFFECT_ALLOW, action="memory.write", resource="*")


def test_create_get_and_the_first_event_carries_the_whole_agent(service: InProcessSession) -> None:
    created = create_agent(
        service.stub,
        "planner",
        display_name="Planner",
        memory={"tone": "brief"},
        permissions=[RULE],
        workspace_root="/srv/planner",
        peers=["coder"],
    )
    assert (created.version, created.archived) == (1, False)
    fetched = service.stub.GetAgent(pb.GetAgentRequest(name="planner")).agent
    assert fetched == created
    first = next(iter(service.stub.WatchEvents(pb.WatchEventsRequest(agent="planner"), timeout=5)))
    assert first.event.WhichOneof("body") == "agent_created"
    assert first.event.agent_created.agent.memory["tone"] == "brief"
    assert first.event.agent_created.agent.workspace_root == "/srv/planner"


def test_duplicate_name_is_already_exists(service: InProcessSession) -> None:
    create_agent(service.stub, "main")
    with pytest.raises(grpc.RpcError) as refused:
        create_agent(service.stub, "main")
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_update_changes_only_the_masked_fields(service: InProcessSession) -> None:
    create_agent(service.stub, "main", display_name="Old", workspace_root="/old")
    updated = service.stub.UpdateAgent(
        pb.UpdateAgentRequest(
            agent=pb.Agent(name="main", display_name="New", workspace_root="/ignored"),
            update_mask=field_mask_pb2.FieldMask(paths=["display_name"]),
        )
    ).agent
    assert (updated.display_name, updated.workspace_root, updated.version) == ("New", "/old", 2)


def test_update_settings_subfield(service: InProcessSession) -> None:
    create_agent(service.stub, "main")
    updated = service.stub.UpdateAgent(
        pb.UpdateAgentRequest(
            agent=pb.Agent(
                name="main",
                settings=pb.AgentSettings(routing=pb.RoutingPolicy(shared_group_sessions=True)),
            ),
            update_mask=field_mask_pb2.FieldMask(paths=["settings.routing.shared_group_sessions"]),
        )
    ).agent
    assert updated.settings.routing.shared_group_sessions
    assert not updated.settings.redact_pii


@pytest.mark.parametrize("path", ["memory", "name", "version", "nonsense"])
def test_update_refuses_other_fields(service: InProcessSession, path: str) -> None:
    create_agent(service.stub, "main")
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.UpdateAgent(
            pb.UpdateAgentRequest(
                agent=pb.Agent(name="main"), update_mask=field_mask_pb2.FieldMask(paths=[path])
            )
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert service.stub.GetAgent(pb.GetAgentRequest(name="main")).agent.version == 1


def test_memory_is_shared_by_all_sessions(service: InProcessSession) -> None:
    create_agent(service.stub, "main")
    one = resolve(service.stub, **web("a")).session
    two = resolve(service.stub, **web("b")).session
    service.stub.PutMemory(pb.PutMemoryRequest(agent="main", key="name", value="Ada"))
    for session in (one, two):
        state = service.stub.GetSessionState(
            pb.GetSessionStateRequest(agent="main", session_id=session.session_id)
        )
        assert state.agent.memory["name"] == "Ada"
    after = service.stub.DeleteMemory(pb.DeleteMemoryRequest(agent="main", key="name")).agent
    assert "name" not in after.memory


def test_delete_archives_and_stops_routing(service: InProcessSession) -> None:
    create_agent(service.stub, "main")
    archived = service.stub.DeleteAgent(pb.DeleteAgentRequest(name="main")).agent
    assert archived.archived
    assert service.stub.GetAgent(pb.GetAgentRequest(name="main")).agent.archived
    with pytest.raises(grpc.RpcError) as refused:
        resolve(service.stub, **web())
    assert error_reason(refused.value) == "AGENT_ARCHIVED"
    listed = service.stub.ListAgents(pb.ListAgentsRequest())
    assert list(listed.agents) == []
    with_archived = service.stub.ListAgents(pb.ListAgentsRequest(include_archived=True))
    assert [a.name for a in with_archived.agents] == ["main"]


def test_list_agents_pages_by_name(service: InProcessSession) -> None:
    for name in ("delta", "alpha", "charlie", "bravo", "echo"):
        create_agent(service.stub, name)
    names: list[str] = []
    token = ""
    while True:
        page = service.stub.ListAgents(pb.ListAgentsRequest(page_size=2, page_token=token))
        names += [agent.name for agent in page.agents]
        token = page.next_page_token
        if not token:
            break
    assert names == ["alpha", "bravo", "charlie", "delta", "echo"]


def test_unknown_agent_is_not_found(service: InProcessSession) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.GetAgent(pb.GetAgentRequest(name="ghost"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as refused:
        resolve(service.stub, "ghost", **web())
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
