"""Routing: Hermes' key rules (shared vectors), key safety, and reyn's routing cases."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2, json_format

from session_service import routing
from session_service.pii import Redactor
from switchboard import validation
from switchboard.errors import InvalidArgument
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import EventLoopThread, session_server
from tests.session.conftest import StartSession, as_record, create_agent, resolve, web
from tests.status import error_reason

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "protos/testdata/session_keys.json").read_text()
)["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_routing_key_vectors(vector: dict[str, Any]) -> None:
    source = as_record(json_format.ParseDict(vector["source"], pb.Source()))
    policy = as_record(json_format.ParseDict(vector["policy"], pb.RoutingPolicy()))
    bound = routing.checked_source(source, vector.get("calling_agent", vector["agent"]))
    # The vectors' redacted keys are unkeyed: servers without a PII key build them so.
    stored = routing.stored_source(bound, Redactor() if vector["redact_pii"] else None)
    expected = vector.get("stored_source", vector["source"])
    assert stored == as_record(json_format.ParseDict(expected, pb.Source()))
    assert routing.routing_key(vector["agent"], stored, policy) == vector["key"]


#: The vectors a ResolveSession of the agent itself routes (a peer source sent by
#: another agent goes through Delegate or SendToPeer: tests/session/test_key_collisions.py).
RESOLVABLE = [v for v in VECTORS if v.get("calling_agent", v["agent"]) == v["agent"]]


def test_the_server_resolves_every_vector_to_its_key(start_session: StartSession) -> None:
    service = start_session()
    for name in sorted({v["agent"] for v in RESOLVABLE}):
        create_agent(service.stub, name)
    for vector in RESOLVABLE:
        settings = pb.AgentSettings(
            routing=json_format.ParseDict(vector["policy"], pb.RoutingPolicy()),
            redact_pii=vector["redact_pii"],
        )
        service.stub.UpdateAgent(
            pb.UpdateAgentRequest(
                agent=pb.Agent(name=vector["agent"], settings=settings),
                update_mask=field_mask_pb2.FieldMask(paths=["settings"]),
            )
        )
        source = json_format.ParseDict(vector["source"], pb.Source())
        answer = service.stub.ResolveSession(
            pb.ResolveSessionRequest(agent=vector["agent"], source=source)
        )
        assert answer.session.routing_key == vector["key"], vector["name"]


SESSION_ID_REJECTED = [
    "../../etc/passwd", "/etc/passwd", "\\windows\\system32\\config", "C:/windows/system32",
    "D:\\path\\to\\file", "good\\..\\bad", "good/../bad", "abc/def", "../../evil",
]  # fmt: skip
SESSION_ID_ACCEPTED = ["abc123", "good123", "20260718_000000_deadbeef"]
KEY_ACCEPTED = [
    "agent:main:local:dm",
    "agent:main:google_chat:group:spaces/AAAAEVvy5RY",
    "agent:main:google_chat:group:spaces/AAAAEVvy5RY:spaces/AAAAEVvy5RY/threads/hrI_46qEx6c",
    "agent:main:google_chat:dm:spaces/9Il3iSAAAAE",
    "agent:main:signal:dm:+13046886277",
    "agent:main:signal:group:f1Ikxzkk8/rr8D4qXG20PyyvqxdLz1ATvwAfr5zunWw=",
]
KEY_REJECTED = [
    "agent:main:../../secret", "/absolute/path/key", "\\absolute\\path\\key", "C:/drive/key",
    "agent:main:signal:group:../../etc/passwd",
]  # fmt: skip


@pytest.mark.parametrize("value", SESSION_ID_REJECTED)
def test_strict_ids_reject_traversal(value: str) -> None:
    with pytest.raises(InvalidArgument):
        validation.path_safe_id("session_id", value)


@pytest.mark.parametrize("value", SESSION_ID_ACCEPTED)
def test_strict_ids_accept_plain_ids(value: str) -> None:
    assert validation.path_safe_id("session_id", value) == value


@pytest.mark.parametrize("value", KEY_ACCEPTED)
def test_loose_keys_accept_slashes_inside(value: str) -> None:
    assert validation.routing_key("key", value) == value


@pytest.mark.parametrize("value", KEY_REJECTED)
def test_loose_keys_reject_traversal(value: str) -> None:
    with pytest.raises(InvalidArgument):
        validation.routing_key("key", value)


@pytest.mark.parametrize("value", SESSION_ID_REJECTED)
def test_spawn_rejects_unsafe_session_ids_and_writes_nothing(
    start_session: StartSession, value: str
) -> None:
    service = start_session()
    create_agent(service.stub)
    head = service.unit.store.log.head
    with service.unit.store.database.connection_context():
        before = head()
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id=value))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with service.unit.store.database.connection_context():
        assert head() == before


def test_same_source_resumes_the_same_session(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    first = resolve(service.stub, **web("tab-1"))
    again = resolve(service.stub, **web("tab-1"))
    other = resolve(service.stub, **web("tab-2"))
    assert first.created and not again.created and other.created
    assert first.session.session_id == again.session.session_id
    assert other.session.session_id != first.session.session_id
    assert first.session.routing_key == "agent:main:web:id=tab-1"


def test_join_an_existing_session_by_id(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    started = resolve(service.stub, **web()).session
    joined = service.stub.ResolveSession(
        pb.ResolveSessionRequest(agent="main", session_id=started.session_id)
    )
    assert joined.session.session_id == started.session_id
    assert not joined.created


def test_unknown_join_is_not_found_and_creates_nothing(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ResolveSession(pb.ResolveSessionRequest(agent="main", session_id="s_typo"))
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(refused.value) == "SESSION_NOT_FOUND"
    listed = service.stub.ListSessions(pb.ListSessionsRequest(agent="main"))
    assert list(listed.sessions) == []


def test_routing_is_scoped_to_one_agent(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub, "alpha")
    create_agent(service.stub, "beta")
    alphas = resolve(service.stub, "alpha", **web()).session
    betas = resolve(service.stub, "beta", **web()).session
    assert alphas.session_id != betas.session_id, "same native id, different agents"
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.ResolveSession(
            pb.ResolveSessionRequest(agent="beta", session_id=alphas.session_id)
        )
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError):
        service.stub.GetSession(pb.GetSessionRequest(agent="beta", session_id=alphas.session_id))


def test_native_ids_with_colons_and_slashes_survive_a_restart(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    source: dict[str, Any] = {
        "transport": "google_chat",
        "chat_type": pb.CHAT_TYPE_GROUP,
        "chat_id": "spaces/AAAA:x",
        "thread_id": "spaces/AAAA/threads/b:c",
        "user_id": "u1",
    }
    with session_server(loop_thread, database_url) as before:
        create_agent(before.stub)
        first = resolve(before.stub, **source).session
    with session_server(loop_thread, database_url) as after:
        again = resolve(after.stub, **source)
    assert not again.created
    assert again.session.session_id == first.session_id
    assert again.session.routing_key == first.routing_key


def test_spawn_with_a_taken_id_is_already_exists(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    service.stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="work-1"))
    with pytest.raises(grpc.RpcError) as refused:
        service.stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="work-1"))
    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS


def test_ended_session_frees_its_key(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    first = resolve(service.stub, **web()).session
    ended = service.stub.EndSession(
        pb.EndSessionRequest(agent="main", session_id=first.session_id, reason="done")
    ).session
    assert (ended.status, ended.end_reason) == (pb.SESSION_STATUS_ENDED, "done")
    fresh = resolve(service.stub, **web())
    assert fresh.created and fresh.session.session_id != first.session_id


def test_reset_points_the_key_at_a_fresh_session(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub)
    first = resolve(service.stub, **web()).session
    reset = service.stub.ResetSession(
        pb.ResetSessionRequest(agent="main", session_id=first.session_id, reason="/new")
    )
    assert reset.ended.status == pb.SESSION_STATUS_ENDED
    assert reset.ended.end_reason == "/new"
    assert reset.session.routing_key == first.routing_key
    assert reset.session.session_id != first.session_id
    assert resolve(service.stub, **web()).session.session_id == reset.session.session_id


def test_concurrent_first_messages_get_one_session(start_session: StartSession) -> None:
    servers = [start_session(), start_session()]
    create_agent(servers[0].stub)
    results: list[str] = []
    barrier = threading.Barrier(8)

    def first_message(index: int) -> None:
        barrier.wait()
        results.append(resolve(servers[index % 2].stub, **web("same-tab")).session.session_id)

    threads = [threading.Thread(target=first_message, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 8
    assert len(set(results)) == 1
    listed = servers[0].stub.ListSessions(pb.ListSessionsRequest(agent="main"))
    assert len(listed.sessions) == 1


def test_redacted_agents_never_store_raw_ids(start_session: StartSession) -> None:
    service = start_session()
    create_agent(service.stub, settings=pb.AgentSettings(redact_pii=True))
    source: dict[str, Any] = {
        "transport": "telegram",
        "chat_type": pb.CHAT_TYPE_GROUP,
        "chat_id": "chat-777777",
        "user_id": "user-424242",
    }
    session = resolve(service.stub, **source).session
    assert session.source.user_id == f"user_{Redactor().digest('user-424242')}"
    assert session.source.chat_id == f"telegram:{Redactor().digest('chat-777777')}"
    assert resolve(service.stub, **source).session.session_id == session.session_id
    database: Any = service.unit.store.database
    with database.connection_context():
        for table in ("session_log", "session_route", "session_session", "session_snapshot"):
            for row in database.execute_sql(f"SELECT * FROM {table}").fetchall():
                dumped = repr(row)
                assert "777777" not in dumped and "424242" not in dumped, (table, row)
