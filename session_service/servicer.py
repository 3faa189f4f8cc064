"""The gRPC face of the SessionService: unpacks requests, packs responses.

Errors raised by the core reach the client through
`switchboard.grpc_errors.DomainErrorInterceptor`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from session_service.continuity import Continuity
from session_service.multi_agent import MultiAgent
from session_service.sessions import Sessions
from session_service.time_travel import TimeTravel
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

Context = Any  # grpc.aio.ServicerContext; unused by these handlers


class SessionServicer(pb_grpc.SessionServiceServicer):
    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.time_travel = TimeTravel(sessions)
        self.multi_agent = MultiAgent(sessions)
        self.continuity = Continuity(sessions)

    async def CreateAgent(  # noqa: N802
        self, request: pb.CreateAgentRequest, context: Context
    ) -> pb.CreateAgentResponse:
        return pb.CreateAgentResponse(agent=await self.sessions.create_agent(request.agent))

    async def GetAgent(  # noqa: N802
        self, request: pb.GetAgentRequest, context: Context
    ) -> pb.GetAgentResponse:
        return pb.GetAgentResponse(agent=await self.sessions.get_agent(request.name))

    async def ListAgents(  # noqa: N802
        self, request: pb.ListAgentsRequest, context: Context
    ) -> pb.ListAgentsResponse:
        agents, token = await self.sessions.list_agents(
            request.include_archived, request.page_size, request.page_token
        )
        return pb.ListAgentsResponse(agents=agents, next_page_token=token)

    async def UpdateAgent(  # noqa: N802
        self, request: pb.UpdateAgentRequest, context: Context
    ) -> pb.UpdateAgentResponse:
        agent = await self.sessions.update_agent(request.agent, request.update_mask)
        return pb.UpdateAgentResponse(agent=agent)

    async def DeleteAgent(  # noqa: N802
        self, request: pb.DeleteAgentRequest, context: Context
    ) -> pb.DeleteAgentResponse:
        return pb.DeleteAgentResponse(agent=await self.sessions.delete_agent(request.name))

    async def PutMemory(  # noqa: N802
        self, request: pb.PutMemoryRequest, context: Context
    ) -> pb.PutMemoryResponse:
        agent = await self.sessions.put_memory(request.agent, request.key, request.value)
        return pb.PutMemoryResponse(agent=agent)

    async def DeleteMemory(  # noqa: N802
        self, request: pb.DeleteMemoryRequest, context: Context
    ) -> pb.DeleteMemoryResponse:
        agent = await self.sessions.delete_memory(request.agent, request.key)
        return pb.DeleteMemoryResponse(agent=agent)

    async def ResolveSession(  # noqa: N802
        self, request: pb.ResolveSessionRequest, context: Context
    ) -> pb.ResolveSessionResponse:
        session, created = await self.sessions.resolve(
            request.agent, request.source, request.session_id
        )
        return pb.ResolveSessionResponse(session=session, created=created)

    async def SpawnSession(  # noqa: N802
        self, request: pb.SpawnSessionRequest, context: Context
    ) -> pb.SpawnSessionResponse:
        session = await self.sessions.spawn(
            request.agent, request.session_id, dict(request.temp_state)
        )
        return pb.SpawnSessionResponse(session=session)

    async def GetSession(  # noqa: N802
        self, request: pb.GetSessionRequest, context: Context
    ) -> pb.GetSessionResponse:
        session = await self.sessions.get_session(request.agent, request.session_id)
        return pb.GetSessionResponse(session=session)

    async def ListSessions(  # noqa: N802
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        sessions, token = await self.sessions.list_sessions(
            request.agent, request.status, request.transport, request.page_size, request.page_token
        )
        return pb.ListSessionsResponse(sessions=sessions, next_page_token=token)

    async def EndSession(  # noqa: N802
        self, request: pb.EndSessionRequest, context: Context
    ) -> pb.EndSessionResponse:
        session = await self.sessions.end(request.agent, request.session_id, request.reason)
        return pb.EndSessionResponse(session=session)

    async def ResetSession(  # noqa: N802
        self, request: pb.ResetSessionRequest, context: Context
    ) -> pb.ResetSessionResponse:
        ended, fresh = await self.sessions.reset(request.agent, request.session_id, request.reason)
        return pb.ResetSessionResponse(ended=ended, session=fresh)

    async def AppendEvents(  # noqa: N802
        self, request: pb.AppendEventsRequest, context: Context
    ) -> pb.AppendEventsResponse:
        expected = request.expected_version if request.HasField("expected_version") else None
        events, version = await self.sessions.append(
            request.agent, request.session_id, expected, request.events
        )
        return pb.AppendEventsResponse(events=events, version=version)

    async def PostToInbox(  # noqa: N802
        self, request: pb.PostToInboxRequest, context: Context
    ) -> pb.PostToInboxResponse:
        event = await self.sessions.post_to_inbox(
            request.agent, request.session_id, request.message
        )
        return pb.PostToInboxResponse(event=event)

    async def GetHistory(  # noqa: N802
        self, request: pb.GetHistoryRequest, context: Context
    ) -> pb.GetHistoryResponse:
        messages = await self.sessions.history(
            request.agent,
            request.session_id,
            request.after_sequence,
            request.limit,
            request.newest,
            request.include_abandoned,
        )
        return pb.GetHistoryResponse(messages=messages)

    async def GetSessionState(  # noqa: N802
        self, request: pb.GetSessionStateRequest, context: Context
    ) -> pb.GetSessionStateResponse:
        state, agent = await self.sessions.state(request.agent, request.session_id)
        return pb.GetSessionStateResponse(state=state, agent=agent)

    async def SnapshotSession(  # noqa: N802
        self, request: pb.SnapshotSessionRequest, context: Context
    ) -> pb.SnapshotSessionResponse:
        sequence = await self.sessions.snapshot(request.agent, request.session_id)
        return pb.SnapshotSessionResponse(sequence=sequence)

    async def WatchEvents(  # noqa: N802
        self, request: pb.WatchEventsRequest, context: Context
    ) -> AsyncIterator[pb.WatchEventsResponse]:
        events = self.sessions.watch(request.after_sequence, request.agent, request.session_id)
        async for event in events:
            yield pb.WatchEventsResponse(event=event)

    async def CreateCheckpoint(  # noqa: N802
        self, request: pb.CreateCheckpointRequest, context: Context
    ) -> pb.CreateCheckpointResponse:
        checkpoint = await self.time_travel.create_checkpoint(request.label)
        return pb.CreateCheckpointResponse(checkpoint=checkpoint)

    async def ListCheckpoints(  # noqa: N802
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        checkpoints = await self.time_travel.list_checkpoints()
        return pb.ListCheckpointsResponse(checkpoints=checkpoints)

    async def Rewind(  # noqa: N802
        self, request: pb.RewindRequest, context: Context
    ) -> pb.RewindResponse:
        sequence = request.sequence if request.WhichOneof("target") == "sequence" else None
        record = await self.time_travel.rewind(sequence, request.checkpoint)
        return pb.RewindResponse(record=record)

    async def Checkout(  # noqa: N802
        self, request: pb.CheckoutRequest, context: Context
    ) -> pb.CheckoutResponse:
        return pb.CheckoutResponse(record=await self.time_travel.checkout(request.sequence))

    async def TruncateLog(  # noqa: N802
        self, request: pb.TruncateLogRequest, context: Context
    ) -> pb.TruncateLogResponse:
        retained, deleted = await self.time_travel.truncate(request.below_sequence)
        return pb.TruncateLogResponse(retained_from=retained, deleted_count=deleted)

    async def ForkSession(  # noqa: N802
        self, request: pb.ForkSessionRequest, context: Context
    ) -> pb.ForkSessionResponse:
        session = await self.multi_agent.fork(
            request.agent, request.session_id, request.at_sequence, request.narrowing
        )
        return pb.ForkSessionResponse(session=session)

    async def Delegate(  # noqa: N802
        self, request: pb.DelegateRequest, context: Context
    ) -> pb.DelegateResponse:
        session, created = await self.multi_agent.delegate(
            request.agent, request.session_id, request.to_agent, request.task, request.context
        )
        return pb.DelegateResponse(session=session, created=created)

    async def SendToPeer(  # noqa: N802
        self, request: pb.SendToPeerRequest, context: Context
    ) -> pb.SendToPeerResponse:
        source = request.source if request.WhichOneof("target") == "source" else None
        event = await self.multi_agent.send_to_peer(
            request.agent,
            request.session_id,
            request.to_agent,
            source,
            request.to_session_id,
            request.message,
        )
        return pb.SendToPeerResponse(event=event)

    async def CheckPermission(  # noqa: N802
        self, request: pb.CheckPermissionRequest, context: Context
    ) -> pb.CheckPermissionResponse:
        decision, sequence = await self.multi_agent.check(
            request.agent, request.session_id, request.action, request.resource
        )
        return pb.CheckPermissionResponse(decision=decision, sequence=sequence)

    async def MarkResumable(  # noqa: N802
        self, request: pb.MarkResumableRequest, context: Context
    ) -> pb.MarkResumableResponse:
        session = await self.continuity.mark(
            request.agent, request.session_id, request.pending, request.holder
        )
        return pb.MarkResumableResponse(session=session)

    async def SuspendSession(  # noqa: N802
        self, request: pb.SuspendSessionRequest, context: Context
    ) -> pb.SuspendSessionResponse:
        session = await self.continuity.suspend(
            request.agent, request.session_id, request.suspended
        )
        return pb.SuspendSessionResponse(session=session)

    async def ListResumable(  # noqa: N802
        self, request: pb.ListResumableRequest, context: Context
    ) -> pb.ListResumableResponse:
        fresh, expired = await self.continuity.list_resumable(request.agent)
        return pb.ListResumableResponse(sessions=fresh, expired=expired)
