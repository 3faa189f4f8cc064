"""Everything a client can read back from both services, as JSON-able data.

The upgrade tests compare these reads before and after a migration: every
agent, session (summary, state, history with abandoned branches), event of the
global log, checkpoint, instance and obligation, read through the gRPC API.
Fields computed from the reader's clock (an instance's `live`, the ledger's
ages and gates) are left out, so a read made months later still compares.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc

TIMEOUT_S = 30.0


def as_dict(message: Message) -> dict[str, Any]:
    return MessageToDict(message, preserving_proto_field_name=True)


def read_sessions(stub: spb_grpc.SessionServiceStub, head: int) -> dict[str, Any]:
    """Every agent and session, and the global log's events 1..`head`."""
    agents: list[spb.Agent] = []
    token = ""
    while True:
        page = stub.ListAgents(
            spb.ListAgentsRequest(include_archived=True, page_size=1, page_token=token),
            timeout=TIMEOUT_S,
        )
        agents.extend(page.agents)
        token = page.next_page_token
        if not token:
            break
    read: dict[str, Any] = {"agents": {}, "checkpoints": [], "events": []}
    for agent in agents:
        name = agent.name
        got = stub.GetAgent(spb.GetAgentRequest(name=name), timeout=TIMEOUT_S).agent
        sessions: list[spb.Session] = []
        token = ""
        while True:
            listed = stub.ListSessions(
                spb.ListSessionsRequest(agent=name, page_size=1, page_token=token),
                timeout=TIMEOUT_S,
            )
            sessions.extend(listed.sessions)
            token = listed.next_page_token
            if not token:
                break
        read["agents"][name] = {"agent": as_dict(got), "listed": as_dict(agent), "sessions": {}}
        for session in sessions:
            sid = session.session_id
            key: dict[str, Any] = {"agent": name, "session_id": sid}
            state_request = spb.GetSessionStateRequest(agent=name, session_id=sid)
            state = stub.GetSessionState(state_request, timeout=TIMEOUT_S)
            read["agents"][name]["sessions"][sid] = {
                "session": as_dict(stub.GetSession(spb.GetSessionRequest(**key)).session),
                "listed": as_dict(session),
                "state": as_dict(state.state),
                "history": as_dict(
                    stub.GetHistory(spb.GetHistoryRequest(agent=name, session_id=sid, limit=1000))
                ),
                "audit_history": as_dict(
                    stub.GetHistory(
                        spb.GetHistoryRequest(
                            agent=name, session_id=sid, limit=1000, include_abandoned=True
                        )
                    )
                ),
            }
    checkpoints = stub.ListCheckpoints(spb.ListCheckpointsRequest(), timeout=TIMEOUT_S)
    read["checkpoints"] = [as_dict(c) for c in checkpoints.checkpoints]
    read["events"] = _events(stub, head)
    return read


def _events(stub: spb_grpc.SessionServiceStub, head: int) -> list[dict[str, Any]]:
    """The global log 1..head as WatchEvents streams it (the stream never ends by
    itself: stop at the head, known from the writes)."""
    events: list[dict[str, Any]] = []
    if head == 0:
        return events
    stream = stub.WatchEvents(spb.WatchEventsRequest(after_sequence=0), timeout=TIMEOUT_S)
    try:
        for response in stream:
            events.append(as_dict(response.event))
            if response.event.sequence >= head:
                break
    finally:
        stream.cancel()
    return events


def read_ledger(stub: dpb_grpc.DeliveryServiceStub, instance_ids: list[str]) -> dict[str, Any]:
    """Every obligation (listed and fetched one by one), the given instances, and the
    counts by state."""
    obligations: list[dpb.Obligation] = []
    token = ""
    while True:
        page = stub.ListObligations(
            dpb.ListObligationsRequest(page_size=2, page_token=token), timeout=TIMEOUT_S
        )
        obligations.extend(page.obligations)
        token = page.next_page_token
        if not token:
            break
    fetched = [
        stub.GetObligation(dpb.GetObligationRequest(obligation_id=row.id)).obligation
        for row in obligations
    ]
    instances = []
    for instance_id in instance_ids:
        instance = stub.GetInstance(
            dpb.GetInstanceRequest(instance_id=instance_id), timeout=TIMEOUT_S
        ).instance
        fields = as_dict(instance)
        fields.pop("live", None)  # computed from the reader's clock
        instances.append(fields)
    stats = stub.GetLedgerStats(dpb.GetLedgerStatsRequest(), timeout=TIMEOUT_S)
    return {
        "obligations": [as_dict(row) for row in obligations],
        "fetched": [as_dict(row) for row in fetched],
        "instances": instances,
        "state_counts": [as_dict(count) for count in stats.state_counts],
    }


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address)
