"""A small but varied data set, written through the real services' gRPC API.

Two agents with memory; sessions from routing, spawning and a slack source, with
messages, an inbox post, temp state, a resume mark, an ended session; a
checkpoint, a rewind to it and a branch after it; a gateway instance and
obligations in every state. Used to build the release fixture and by the
upgrade tests.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc


@dataclass(frozen=True)
class Written:
    #: The global log's last sequence after the writes (the last write is an append).
    head: int
    instance_ids: list[str]


def _message(role: spb.Role.ValueType, content: str) -> spb.SessionEventInput:
    return spb.SessionEventInput(
        message_appended=spb.MessageAppended(message=spb.Message(role=role, content=content))
    )


def _say(stub: spb_grpc.SessionServiceStub, agent: str, sid: str, *texts: str) -> int:
    events = [
        _message(spb.ROLE_USER if i % 2 == 0 else spb.ROLE_ASSISTANT, text)
        for i, text in enumerate(texts)
    ]
    answer = stub.AppendEvents(spb.AppendEventsRequest(agent=agent, session_id=sid, events=events))
    return answer.events[-1].sequence


def write_sessions(stub: spb_grpc.SessionServiceStub, *, resume_mark: bool = True) -> int:
    """Writes the session half; returns the log head. `resume_mark` sets a session's
    resume_pending (leave it off where the column is to be dropped)."""
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="alpha", display_name="Alpha")))
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="beta", display_name="Beta")))
    stub.PutMemory(spb.PutMemoryRequest(agent="alpha", key="tone", value="friendly"))

    web = stub.ResolveSession(
        spb.ResolveSessionRequest(
            agent="alpha", source=spb.Source(transport="web", conversation_id="c-1")
        )
    ).session
    _say(stub, "alpha", web.session_id, "hello", "hi, how can I help?", "tell me a joke")
    spawned = stub.SpawnSession(
        spb.SpawnSessionRequest(agent="alpha", session_id="spawned-1", temp_state={"k": "v"})
    ).session
    _say(stub, "alpha", spawned.session_id, "background task", "on it")
    stub.PostToInbox(
        spb.PostToInboxRequest(
            agent="alpha",
            session_id=spawned.session_id,
            message=spb.Message(role=spb.ROLE_USER, content="queued for later", sender="ops"),
        )
    )
    slack = stub.ResolveSession(
        spb.ResolveSessionRequest(
            agent="beta",
            source=spb.Source(
                transport="slack", chat_type=spb.CHAT_TYPE_CHANNEL, chat_id="C1", user_id="U1"
            ),
        )
    ).session
    _say(stub, "beta", slack.session_id, "status?", "all green")

    stub.CreateCheckpoint(spb.CreateCheckpointRequest(label="before-rewind"))
    _say(stub, "alpha", web.session_id, "a branch the rewind abandons", "abandoned answer")
    stub.Rewind(spb.RewindRequest(checkpoint="before-rewind"))
    if resume_mark:
        stub.MarkResumable(
            spb.MarkResumableRequest(
                agent="beta", session_id=slack.session_id, pending=True, holder="gw-1"
            )
        )
    ended = stub.ResolveSession(
        spb.ResolveSessionRequest(
            agent="beta", source=spb.Source(transport="web", conversation_id="c-2")
        )
    ).session
    _say(stub, "beta", ended.session_id, "bye")
    stub.EndSession(spb.EndSessionRequest(agent="beta", session_id=ended.session_id, reason="done"))
    return _say(stub, "alpha", web.session_id, "after the rewind", "a new branch")


def write_ledger(stub: dpb_grpc.DeliveryServiceStub) -> list[str]:
    """Writes the delivery half: one instance and obligations in every state."""
    instance = stub.RegisterInstance(
        dpb.RegisterInstanceRequest(
            gateway_name="fixture-gateway", host="fixture-host", pid=os.getpid(),
            platforms=["slack", "telegram"],
        )
    ).instance  # fmt: skip
    owner = instance.instance_id

    def record(ref: str, platform: str = "slack") -> dpb.Obligation:
        return stub.RecordObligation(
            dpb.RecordObligationRequest(
                instance_id=owner, session_key=f"agent:alpha:{platform}:channel:C1",
                message_ref=ref, content=f"reply {ref}", platform=platform, chat_id="C1",
                thread_id="171.001", metadata={"ref": ref},
            )
        ).obligation  # fmt: skip

    def attempting(row: dpb.Obligation) -> dpb.Obligation:
        return stub.MarkAttempting(
            dpb.MarkAttemptingRequest(obligation_id=row.id, instance_id=owner, fence=row.fence)
        ).obligation

    record("m-pending")
    attempting(record("m-attempting"))
    row = attempting(record("m-delivered"))
    stub.MarkDelivered(
        dpb.MarkDeliveredRequest(
            obligation_id=row.id, instance_id=owner, fence=row.fence, platform_message_id="pm-1"
        )
    )
    row = attempting(record("m-retry", "telegram"))
    stub.MarkFailed(
        dpb.MarkFailedRequest(
            obligation_id=row.id, instance_id=owner, fence=row.fence, error="503", retryable=True
        )
    )
    row = attempting(record("m-failed"))
    stub.MarkFailed(
        dpb.MarkFailedRequest(
            obligation_id=row.id, instance_id=owner, fence=row.fence, error="403", retryable=False
        )
    )
    row = record("m-abandoned")
    stub.AbandonObligation(dpb.AbandonObligationRequest(obligation_id=row.id, reason="by hand"))
    return [owner]
