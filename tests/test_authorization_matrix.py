"""The authorization matrix: every RPC of both services, called by every kind of
principal, on a resource of agent A (alice) and of agent B (bob).

One table below holds the expected answer of every cell. Each cell builds fresh
resources (as their owner would) and then makes the call as the principal, on
real servers sharing one database, on both backends. An RPC added to a service
without a row here fails `test_every_rpc_has_a_row`.

Codes: U UNAUTHENTICATED, P PERMISSION_DENIED, N NOT_FOUND, OK success with the
resource in the answer, 0 success without it (a list or claim filtered to the
caller's agents).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import field_mask_pb2

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import (
    EventLoopThread,
    delivery_server,
    postgres_schema,
    postgres_unreachable_reason,
    session_server,
)
from tests.status import error_reason

TOKENS = {"alice": "tok-alice", "bob": "tok-bob", "gateway": "tok-gw", "admin": "tok-admin"}
GRANTS = parse_tokens(
    "tok-alice=agents:alice;tok-bob=agents:bob;tok-gw=gateway:gw-alice:alice;tok-admin=admin"
)
#: The principals of the matrix, in the order of the table's columns. The gateway
#: token acts for alice only, as gateway gw-alice.
PRINCIPALS = ("none", "alice", "bob", "gateway", "admin")
OWNERS = ("alice", "bob")

#: Shapes most rows share: (on alice's resource, on bob's resource).
ADMIN_ONLY = ("U P P P OK", "U P P P OK")
FOR_ITS_AGENTS = ("U OK P OK OK", "U P OK P OK")
ITS_INSTANCES = ("U OK N N OK", "U N OK N OK")
ITS_AGENTS_ROWS = ("U OK N OK OK", "U N OK N OK")
FILTERED = ("U OK 0 OK OK", "U 0 OK 0 OK")

EXPECTED: dict[str, tuple[str, str]] = {
    # SessionService: agent fields must be the token's agents; operator calls are admin's.
    "CreateAgent": ADMIN_ONLY,
    "GetAgent": FOR_ITS_AGENTS,
    "ListAgents": ADMIN_ONLY,
    "UpdateAgent": ADMIN_ONLY,
    "DeleteAgent": ADMIN_ONLY,
    "PutMemory": FOR_ITS_AGENTS,
    "DeleteMemory": FOR_ITS_AGENTS,
    "ResolveSession": FOR_ITS_AGENTS,
    "SpawnSession": FOR_ITS_AGENTS,
    "GetSession": FOR_ITS_AGENTS,
    "ListSessions": FOR_ITS_AGENTS,
    "EndSession": FOR_ITS_AGENTS,
    "ResetSession": FOR_ITS_AGENTS,
    "AppendEvents": FOR_ITS_AGENTS,
    "PostToInbox": FOR_ITS_AGENTS,
    "GetHistory": FOR_ITS_AGENTS,
    "GetSessionState": FOR_ITS_AGENTS,
    "SnapshotSession": FOR_ITS_AGENTS,
    "WatchEvents": FOR_ITS_AGENTS,
    "CreateCheckpoint": ADMIN_ONLY,
    "ListCheckpoints": ADMIN_ONLY,
    "Rewind": ADMIN_ONLY,
    "Checkout": ADMIN_ONLY,
    "TruncateLog": ADMIN_ONLY,
    "ListLogEvents": ADMIN_ONLY,
    "RecordOperatorAction": ADMIN_ONLY,
    "ForkSession": FOR_ITS_AGENTS,
    "Delegate": FOR_ITS_AGENTS,
    "SendToPeer": FOR_ITS_AGENTS,
    "CheckPermission": FOR_ITS_AGENTS,
    "MarkResumable": FOR_ITS_AGENTS,
    "SuspendSession": FOR_ITS_AGENTS,
    "ListResumable": FOR_ITS_AGENTS,
    "ExpireResumable": FOR_ITS_AGENTS,
    "RetractMessages": FOR_ITS_AGENTS,
    "UpdateState": FOR_ITS_AGENTS,
    "GetUserState": FOR_ITS_AGENTS,
    "PutRecords": FOR_ITS_AGENTS,
    "GetRecord": FOR_ITS_AGENTS,
    "ListRecords": FOR_ITS_AGENTS,
    "EraseSession": FOR_ITS_AGENTS,
    "EraseRecords": FOR_ITS_AGENTS,
    # DeliveryService: instances are their registrant's, rows their agent's.
    "RegisterInstance": ("U OK OK OK OK", "U OK OK P OK"),  # gateway tokens: own name only
    "Heartbeat": ITS_INSTANCES,
    "DeregisterInstance": ITS_INSTANCES,
    "GetInstance": ITS_INSTANCES,
    "RecordObligation": FOR_ITS_AGENTS,
    "MarkAttempting": ITS_INSTANCES,
    "MarkDelivered": ITS_INSTANCES,
    "MarkFailed": ITS_INSTANCES,
    "ClaimRecoverable": FILTERED,
    "GetObligation": ITS_AGENTS_ROWS,
    "ListObligations": FILTERED,
    "CountObligations": FILTERED,
    "RetryObligation": ADMIN_ONLY,
    "AbandonObligation": ADMIN_ONLY,
    "GetLedgerStats": ADMIN_ONLY,
    "PruneObligations": ADMIN_ONLY,
    "HandOverObligations": ADMIN_ONLY,
    "ListInstances": ADMIN_ONLY,  # every principal's instances
    # Both services': the calls each carries answer as their unary rows (`_carried`).
    "CallStream": FOR_ITS_AGENTS,
}

_CODES = {
    "U": grpc.StatusCode.UNAUTHENTICATED,
    "P": grpc.StatusCode.PERMISSION_DENIED,
    "N": grpc.StatusCode.NOT_FOUND,
}
_counter = itertools.count()


def _metadata(principal: str) -> tuple[tuple[str, str], ...]:
    return () if principal == "none" else (("authorization", f"Bearer {TOKENS[principal]}"),)


def _unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


def _gateway_name(principal: str, owner: str) -> str:
    """The gateway a caller's instance registers as: the owner's own gateway, except
    for the gateway token, which may register its own name only."""
    return "gw-alice" if principal == "gateway" else f"gw-{owner}"


@dataclass
class World:
    """Both services on one database, with agents alice and bob (each its own peer,
    so that the peer calls pass the permission gate for their own agent)."""

    sessions: pb_grpc.SessionServiceStub
    delivery: dpb_grpc.DeliveryServiceStub

    def as_admin(self) -> tuple[tuple[str, str], ...]:
        return _metadata("admin")

    def session_of(self, owner: str) -> str:
        source = pb.Source(transport="web", conversation_id=_unique("conv"))
        answer = self.sessions.ResolveSession(
            pb.ResolveSessionRequest(agent=owner, source=source), metadata=self.as_admin()
        )
        return str(answer.session.session_id)

    def appended(self, owner: str, session_id: str) -> int:
        """Appends one message; returns its sequence."""
        answer = self.sessions.AppendEvents(
            pb.AppendEventsRequest(agent=owner, session_id=session_id, events=[_said("hi")]),
            metadata=self.as_admin(),
        )
        return int(answer.events[-1].sequence)

    def instance_of(self, principal: str, gateway_name: str) -> str:
        registrant = "admin" if principal == "none" else principal
        answer = self.delivery.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name=gateway_name, platforms=["web"]),
            metadata=_metadata(registrant),
        )
        return str(answer.instance.instance_id)

    def obligation_of(self, owner: str) -> tuple[dpb.Obligation, str]:
        """A reply owed in one of the owner's sessions, recorded by the owner's gateway."""
        instance_id = self.instance_of(owner, f"gw-{owner}")
        answer = self.delivery.RecordObligation(
            _record(instance_id, owner), metadata=_metadata(owner)
        )
        return answer.obligation, instance_id

    def orphan_of(self, owner: str) -> dpb.Obligation:
        """A row whose recording instance stopped before sending it."""
        row, instance_id = self.obligation_of(owner)
        self.delivery.DeregisterInstance(
            dpb.DeregisterInstanceRequest(instance_id=instance_id), metadata=_metadata(owner)
        )
        return row


def _said(text: str) -> pb.SessionEventInput:
    message = pb.Message(role=pb.ROLE_USER, content=text)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def _message() -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, content="hello")


def _record(instance_id: str, owner: str) -> dpb.RecordObligationRequest:
    return dpb.RecordObligationRequest(
        instance_id=instance_id,
        session_key=f"agent:{owner}:web:{_unique('conv')}",
        message_ref="m1",
        content=_unique("the answer"),
        platform="web",
        chat_id="tab-1",
    )


#: A prepared call: run it with the caller's metadata; `present` tells from the
#: answer whether the owner's resource is in it (for filtered lists and claims).
Call = Callable[[tuple[tuple[str, str], ...]], Any]


@dataclass
class Cell:
    call: Call
    present: Callable[[Any], bool] = lambda answer: True


Builder = Callable[[World, str, str], Cell]


#: Requests on one session, for the calls that name a session beside its agent.
SESSION_REQUESTS: dict[str, Callable[[str, str], Any]] = {
    "GetSession": lambda o, s: pb.GetSessionRequest(agent=o, session_id=s),
    "EndSession": lambda o, s: pb.EndSessionRequest(agent=o, session_id=s),
    "ResetSession": lambda o, s: pb.ResetSessionRequest(agent=o, session_id=s),
    "AppendEvents": lambda o, s: pb.AppendEventsRequest(
        agent=o, session_id=s, events=[_said("hi")]
    ),
    "PostToInbox": lambda o, s: pb.PostToInboxRequest(agent=o, session_id=s, message=_message()),
    "GetHistory": lambda o, s: pb.GetHistoryRequest(agent=o, session_id=s),
    "GetSessionState": lambda o, s: pb.GetSessionStateRequest(agent=o, session_id=s),
    "SnapshotSession": lambda o, s: pb.SnapshotSessionRequest(agent=o, session_id=s),
    "ForkSession": lambda o, s: pb.ForkSessionRequest(agent=o, session_id=s),
    "Delegate": lambda o, s: pb.DelegateRequest(
        agent=o, session_id=s, to_agent=o, task=_message(), context=_unique("ctx")
    ),
    "CheckPermission": lambda o, s: pb.CheckPermissionRequest(
        agent=o, session_id=s, action="fs.read", resource="workspace:notes.txt"
    ),
    "MarkResumable": lambda o, s: pb.MarkResumableRequest(agent=o, session_id=s, pending=True),
    "SuspendSession": lambda o, s: pb.SuspendSessionRequest(agent=o, session_id=s, suspended=True),
    "WatchEvents": lambda o, s: pb.WatchEventsRequest(agent=o, session_id=s),
    "SendToPeer": lambda o, s: pb.SendToPeerRequest(
        agent=o, session_id=s, to_agent=o, to_session_id=s, message=_message()
    ),
    "RetractMessages": lambda o, s: pb.RetractMessagesRequest(
        agent=o, session_id=s, newest_count=1
    ),
    "UpdateState": lambda o, s: pb.UpdateStateRequest(
        agent=o,
        session_id=s,
        deltas=[pb.StateDelta(scope=pb.STATE_SCOPE_SESSION, set={"k": "1"})],
    ),
    "PutRecords": lambda o, s: pb.PutRecordsRequest(
        agent=o, session_id=s, records=[pb.StoredRecord(kind="checkpoint", key="c1")]
    ),
    "ListRecords": lambda o, s: pb.ListRecordsRequest(agent=o, session_id=s, kind="checkpoint"),
    "EraseSession": lambda o, s: pb.EraseSessionRequest(agent=o, session_id=s),
    "EraseRecords": lambda o, s: pb.EraseRecordsRequest(
        agent=o, session_id=s, kind="checkpoint", all=True
    ),
}


def _call_session(world: World, rpc: str, request: Any) -> Call:
    def call(metadata: tuple[tuple[str, str], ...]) -> Any:
        answer = getattr(world.sessions, rpc)(request, metadata=metadata, timeout=10)
        if rpc != "WatchEvents":
            return answer
        try:
            return next(answer)
        finally:
            answer.cancel()

    return call


class _CarriedError(grpc.RpcError):
    """A call's error as a CallStream answered it (code and message of a google.rpc.Status)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self._code = next(c for c in grpc.StatusCode if c.value[0] == code)
        self._message = message

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message


def _carried_answer(call_stream: Any, request: Any, metadata: Any) -> Any:
    (answer,) = call_stream(iter([request]), metadata=metadata)
    if answer.WhichOneof("result") == "error":
        raise _CarriedError(answer.error.code, answer.error.message)
    return answer


def _carried(world: World, owner: str, principal: str) -> Cell:
    """AppendEvents over the SessionService's CallStream and RecordObligation over the
    DeliveryService's, both on the owner's resources: each answers as its unary row."""
    append = SESSION_REQUESTS["AppendEvents"](owner, world.session_of(owner))
    instance_id = world.instance_of(principal, _gateway_name(principal, owner))
    record = _record(instance_id, owner)

    def call(metadata: tuple[tuple[str, str], ...]) -> Any:
        outcomes = []
        for stream, request in (
            (world.sessions.CallStream, pb.CallStreamRequest(append_events=append)),
            (world.delivery.CallStream, dpb.CallStreamRequest(record_obligation=record)),
        ):
            try:
                outcomes.append(("OK", _carried_answer(stream, request, metadata)))
            except grpc.RpcError as error:
                outcomes.append((error.code().name, error))
        if outcomes[0][0] != outcomes[1][0]:
            raise _CarriedError(2, f"the two streams disagree: {outcomes}")  # UNKNOWN
        if isinstance(outcomes[0][1], grpc.RpcError):
            raise outcomes[0][1]
        return outcomes[0][1]

    return Cell(call)


def _session_cell(rpc: str) -> Builder:
    """A call on a fresh session of the owner, named as its owner names it."""

    def build(world: World, owner: str, principal: str) -> Cell:
        request = SESSION_REQUESTS[rpc](owner, world.session_of(owner))
        return Cell(_call_session(world, rpc, request))

    return build


def _record_read(world: World, owner: str, principal: str) -> Cell:
    """GetRecord of a record its owner put."""
    session_id = world.session_of(owner)
    stored = pb.StoredRecord(kind="checkpoint", key="c1", payload=b"state")
    world.sessions.PutRecords(
        pb.PutRecordsRequest(agent=owner, session_id=session_id, records=[stored]),
        metadata=world.as_admin(),
    )
    request = pb.GetRecordRequest(agent=owner, session_id=session_id, kind="checkpoint")
    return Cell(lambda metadata: world.sessions.GetRecord(request, metadata=metadata))


def _listed_sessions(world: World, owner: str, principal: str) -> Cell:
    session_id = world.session_of(owner)
    return Cell(
        lambda metadata: world.sessions.ListSessions(
            pb.ListSessionsRequest(agent=owner), metadata=metadata
        ),
        lambda answer: session_id in {s.session_id for s in answer.sessions},
    )


def _new_agent(world: World, owner: str) -> str:
    name = _unique(f"{owner}-sub")
    world.sessions.CreateAgent(
        pb.CreateAgentRequest(agent=pb.Agent(name=name)), metadata=world.as_admin()
    )
    return name


def _memory_deleted(world: World, owner: str, principal: str) -> Cell:
    key = _unique("k")
    world.sessions.PutMemory(
        pb.PutMemoryRequest(agent=owner, key=key, value="v"), metadata=world.as_admin()
    )
    request = pb.DeleteMemoryRequest(agent=owner, key=key)
    return Cell(lambda metadata: world.sessions.DeleteMemory(request, metadata=metadata))


def _travel(rpc: str) -> Builder:
    """Rewind or Checkout to the owner's newest event: nothing after it to abandon."""

    def build(world: World, owner: str, principal: str) -> Cell:
        sequence = world.appended(owner, world.session_of(owner))
        request = getattr(pb, f"{rpc}Request")(sequence=sequence)
        return Cell(lambda metadata: getattr(world.sessions, rpc)(request, metadata=metadata))

    return build


def _plain(rpc: str, make: Callable[[World, str], Any], service: str = "sessions") -> Builder:
    def build(world: World, owner: str, principal: str) -> Cell:
        request = make(world, owner)
        stub = getattr(world, service)
        return Cell(lambda metadata: getattr(stub, rpc)(request, metadata=metadata))

    return build


def _on_instance(rpc: str) -> Builder:
    """Heartbeat, DeregisterInstance, GetInstance on an instance the owner registered."""

    def build(world: World, owner: str, principal: str) -> Cell:
        instance_id = world.instance_of(owner, f"gw-{owner}")
        request = getattr(dpb, f"{rpc}Request")(instance_id=instance_id)
        return Cell(lambda metadata: getattr(world.delivery, rpc)(request, metadata=metadata))

    return build


def _recorded(world: World, owner: str, principal: str) -> Cell:
    instance_id = world.instance_of(principal, _gateway_name(principal, owner))
    request = _record(instance_id, owner)
    return Cell(lambda metadata: world.delivery.RecordObligation(request, metadata=metadata))


def _held(rpc: str, **fields: Any) -> Builder:
    """A fenced transition by the owner's recording instance, with its fence."""

    def build(world: World, owner: str, principal: str) -> Cell:
        row, instance_id = world.obligation_of(owner)
        request = getattr(dpb, f"{rpc}Request")(
            obligation_id=row.id, instance_id=instance_id, fence=row.fence, **fields
        )
        return Cell(lambda metadata: getattr(world.delivery, rpc)(request, metadata=metadata))

    return build


def _claimed(world: World, owner: str, principal: str) -> Cell:
    orphan = world.orphan_of(owner)
    instance_id = world.instance_of(principal, _gateway_name(principal, owner))
    request = dpb.ClaimRecoverableRequest(instance_id=instance_id, limit=1000)
    return Cell(
        lambda metadata: world.delivery.ClaimRecoverable(request, metadata=metadata),
        lambda answer: orphan.id in {row.id for row in answer.obligations},
    )


def _listed_rows(world: World, owner: str, principal: str) -> Cell:
    row, _ = world.obligation_of(owner)
    request = dpb.ListObligationsRequest(session_key=row.session_key)
    return Cell(
        lambda metadata: world.delivery.ListObligations(request, metadata=metadata),
        lambda answer: row.id in {listed.id for listed in answer.obligations},
    )


def _counted_rows(world: World, owner: str, principal: str) -> Cell:
    row, _ = world.obligation_of(owner)
    request = dpb.CountObligationsRequest(session_key=row.session_key)
    return Cell(
        lambda metadata: world.delivery.CountObligations(request, metadata=metadata),
        lambda answer: answer.count == 1,
    )


def _listed_instances(world: World, owner: str, principal: str) -> Cell:
    instance_id = world.instance_of(owner, f"gw-{owner}")
    request = dpb.ListInstancesRequest(gateway_name=f"gw-{owner}", page_size=1000)
    return Cell(
        lambda metadata: world.delivery.ListInstances(request, metadata=metadata),
        lambda answer: instance_id in {s.instance.instance_id for s in answer.instances},
    )


def _row_request(rpc: str, failed_first: bool = False, **fields: Any) -> Builder:
    """A call naming one of the owner's rows; `failed_first`: given up on first."""

    def build(world: World, owner: str, principal: str) -> Cell:
        row, instance_id = world.obligation_of(owner)
        if failed_first:
            world.delivery.MarkFailed(
                dpb.MarkFailedRequest(
                    obligation_id=row.id, instance_id=instance_id, fence=row.fence, error="gone"
                ),
                metadata=_metadata(owner),
            )
        request = getattr(dpb, f"{rpc}Request")(obligation_id=row.id, **fields)
        return Cell(lambda metadata: getattr(world.delivery, rpc)(request, metadata=metadata))

    return build


def _handed_over(world: World, owner: str, principal: str) -> Cell:
    world.orphan_of(owner)
    request = dpb.HandOverObligationsRequest(
        from_gateway_name=f"gw-{owner}", to_gateway_name=f"gw-{owner}-new"
    )
    return Cell(lambda metadata: world.delivery.HandOverObligations(request, metadata=metadata))


BUILDERS: dict[str, Builder] = {
    "CreateAgent": _plain(
        "CreateAgent",
        lambda w, o: pb.CreateAgentRequest(agent=pb.Agent(name=_unique(f"{o}-new"))),
    ),
    "GetAgent": _plain("GetAgent", lambda w, o: pb.GetAgentRequest(name=o)),
    "ListAgents": _plain("ListAgents", lambda w, o: pb.ListAgentsRequest()),
    "UpdateAgent": _plain(
        "UpdateAgent",
        lambda w, o: pb.UpdateAgentRequest(
            agent=pb.Agent(name=o, display_name=_unique("shown")),
            update_mask=field_mask_pb2.FieldMask(paths=["display_name"]),
        ),
    ),
    "DeleteAgent": _plain("DeleteAgent", lambda w, o: pb.DeleteAgentRequest(name=_new_agent(w, o))),
    "PutMemory": _plain("PutMemory", lambda w, o: pb.PutMemoryRequest(agent=o, key="k", value="v")),
    "DeleteMemory": _memory_deleted,
    "ResolveSession": _plain(
        "ResolveSession",
        lambda w, o: pb.ResolveSessionRequest(
            agent=o, source=pb.Source(transport="web", conversation_id=_unique("conv"))
        ),
    ),
    "SpawnSession": _plain("SpawnSession", lambda w, o: pb.SpawnSessionRequest(agent=o)),
    "GetSession": _session_cell("GetSession"),
    "ListSessions": _listed_sessions,
    "EndSession": _session_cell("EndSession"),
    "ResetSession": _session_cell("ResetSession"),
    "AppendEvents": _session_cell("AppendEvents"),
    "PostToInbox": _session_cell("PostToInbox"),
    "GetHistory": _session_cell("GetHistory"),
    "GetSessionState": _session_cell("GetSessionState"),
    "SnapshotSession": _session_cell("SnapshotSession"),
    "WatchEvents": _session_cell("WatchEvents"),
    "CreateCheckpoint": _plain(
        "CreateCheckpoint", lambda w, o: pb.CreateCheckpointRequest(label=_unique(f"{o}-cp"))
    ),
    "ListCheckpoints": _plain("ListCheckpoints", lambda w, o: pb.ListCheckpointsRequest()),
    "Rewind": _travel("Rewind"),
    "Checkout": _travel("Checkout"),
    "TruncateLog": _plain("TruncateLog", lambda w, o: pb.TruncateLogRequest(below_sequence=1)),
    "ListLogEvents": _plain("ListLogEvents", lambda w, o: pb.ListLogEventsRequest(agent=o)),
    "RecordOperatorAction": _plain(
        "RecordOperatorAction",
        lambda w, o: pb.RecordOperatorActionRequest(action="test.matrix", subject=o),
    ),
    "ForkSession": _session_cell("ForkSession"),
    "Delegate": _session_cell("Delegate"),
    "SendToPeer": _session_cell("SendToPeer"),
    "CheckPermission": _session_cell("CheckPermission"),
    "MarkResumable": _session_cell("MarkResumable"),
    "SuspendSession": _session_cell("SuspendSession"),
    "ListResumable": _plain("ListResumable", lambda w, o: pb.ListResumableRequest(agent=o)),
    "ExpireResumable": _plain("ExpireResumable", lambda w, o: pb.ExpireResumableRequest(agent=o)),
    "RetractMessages": _session_cell("RetractMessages"),
    "UpdateState": _session_cell("UpdateState"),
    "GetUserState": _plain(
        "GetUserState", lambda w, o: pb.GetUserStateRequest(agent=o, user_id="someone")
    ),
    "PutRecords": _session_cell("PutRecords"),
    "GetRecord": _record_read,
    "ListRecords": _session_cell("ListRecords"),
    "EraseSession": _session_cell("EraseSession"),
    "EraseRecords": _session_cell("EraseRecords"),
    "RegisterInstance": lambda w, o, p: Cell(
        lambda metadata: w.delivery.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name=f"gw-{o}", platforms=["web"]),
            metadata=metadata,
        )
    ),
    "Heartbeat": _on_instance("Heartbeat"),
    "DeregisterInstance": _on_instance("DeregisterInstance"),
    "GetInstance": _on_instance("GetInstance"),
    "RecordObligation": _recorded,
    "MarkAttempting": _held("MarkAttempting"),
    "MarkDelivered": _held("MarkDelivered", platform_message_id="p1"),
    "MarkFailed": _held("MarkFailed", error="timeout", retryable=True),
    "ClaimRecoverable": _claimed,
    "GetObligation": _row_request("GetObligation"),
    "ListObligations": _listed_rows,
    "CountObligations": _counted_rows,
    "RetryObligation": _row_request("RetryObligation", failed_first=True),
    "AbandonObligation": _row_request("AbandonObligation", reason="operator test"),
    "GetLedgerStats": _plain(
        "GetLedgerStats", lambda w, o: dpb.GetLedgerStatsRequest(), "delivery"
    ),
    "PruneObligations": _plain(
        "PruneObligations", lambda w, o: dpb.PruneObligationsRequest(), "delivery"
    ),
    "HandOverObligations": _handed_over,
    "ListInstances": _listed_instances,
    "CallStream": _carried,
}


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def world(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    loop_thread: EventLoopThread,
) -> Iterator[World]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('matrix') / 'switchboard.sqlite3'}"
        yield from _world(url, loop_thread)
        return
    unreachable = postgres_unreachable_reason()
    if unreachable:
        pytest.skip(unreachable)
    with postgres_schema() as url:
        yield from _world(url, loop_thread)


def _world(url: str, loop_thread: EventLoopThread) -> Iterator[World]:
    with (
        session_server(loop_thread, url, auth=GRANTS) as sessions,
        delivery_server(loop_thread, url, auth=GRANTS) as delivery,
    ):
        world = World(sessions.stub, delivery.stub)
        for name in OWNERS:
            agent = pb.Agent(
                name=name,
                peers=[name],
                permissions=[pb.PermissionRule(effect=pb.PERMISSION_EFFECT_ALLOW, action="fs.*")],
            )
            sessions.stub.CreateAgent(pb.CreateAgentRequest(agent=agent), metadata=world.as_admin())
        yield world


def _outcome(cell: Cell, principal: str) -> str:
    try:
        answer = cell.call(_metadata(principal))
    except grpc.RpcError as error:
        for letter, code in _CODES.items():
            if error.code() == code:
                return letter
        return f"{error.code().name}: {error.details()}"
    return "OK" if cell.present(answer) else "0"


def test_every_rpc_has_a_row() -> None:
    methods = {
        method.name
        for module in (pb, dpb)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert methods == set(EXPECTED) == set(BUILDERS)


@pytest.mark.parametrize("rpc", sorted(EXPECTED))
def test_matrix_row(world: World, rpc: str) -> None:
    got, wanted = {}, {}
    for owner, expected in zip(OWNERS, EXPECTED[rpc], strict=True):
        for principal, code in zip(PRINCIPALS, expected.split(), strict=True):
            cell = BUILDERS[rpc](world, owner, principal)
            got[owner, principal] = _outcome(cell, principal)
            wanted[owner, principal] = code
    assert got == wanted


@pytest.mark.parametrize("rpc", sorted(SESSION_REQUESTS))
def test_another_agents_session_is_missing_under_ones_own_name(world: World, rpc: str) -> None:
    """Alice naming herself and one of bob's sessions learns what a missing id
    tells her: NOT_FOUND, the same reason and message."""
    bobs, missing = world.session_of("bob"), "s_" + uuid.uuid4().hex
    answers = {}
    for session_id in (bobs, missing):
        call = _call_session(world, rpc, SESSION_REQUESTS[rpc]("alice", session_id))
        with pytest.raises(grpc.RpcError) as refused:
            call(_metadata("alice"))
        answers[session_id] = refused.value
    seen, absent = answers[bobs], answers[missing]
    assert seen.code() == absent.code() == grpc.StatusCode.NOT_FOUND
    assert error_reason(seen) == error_reason(absent)
    assert str(seen.details()).replace(bobs, "<id>") == str(absent.details()).replace(
        missing, "<id>"
    )
