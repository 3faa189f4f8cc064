"""The gRPC face of the SessionService: unpacks requests, packs responses.

Errors raised by the core reach the client through
`switchboard.grpc_errors.DomainErrorInterceptor`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import Message as ProtoMessage

from session_service import checks, convert, records
from session_service.composition import Parts
from session_service.continuity import post_mark
from session_service.erasure import RecordSelection
from session_service.log_reads import LogQuery
from session_service.scoped_state import ScopedView
from session_service.storage.records_store import RecordQuery
from session_service.stored_records import ListRequest
from session_service.time_travel import Move
from switchboard import auth, validation
from switchboard.call_stream import CarriedCalls
from switchboard.idempotency import RequestGuard, RequestStore
from switchboard.mutations import Mutations
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc

Context = Any  # grpc.aio.ServicerContext; unused by these handlers


#: The fields naming sessions in requests and answers (see `named_sessions`).
_SESSION_FIELDS = frozenset({"session_id", "to_session_id", "session_ids"})


def named_sessions(request: ProtoMessage, response: ProtoMessage) -> list[str]:
    """The sessions a remembered call's request or answer names: what an erasure of
    one of them finds the call's stored answer by (it may carry the session's
    content), so that the answer goes with the session."""
    found: set[str] = set()
    pending: list[ProtoMessage] = [request, response]
    while pending:
        message = pending.pop()
        for field, value in message.ListFields():
            kind: Any = field.message_type  # None for scalars
            if kind is not None:
                if not kind.GetOptions().map_entry:
                    pending.extend(value if field.is_repeated else [value])
            elif field.name in _SESSION_FIELDS:
                found.update(value if field.is_repeated else [value])
    return sorted(found)


mutation = Mutations(pb.DESCRIPTOR.services_by_name["SessionService"], subjects=named_sessions)

# The core answers in records (`session_service.records`): converted here, once per
# answer, and requests' messages once on the way in.


def _agent(agent: records.Agent) -> pb.Agent:
    message: pb.Agent = convert.to_pb(agent)
    return message


def _session(session: records.Session) -> pb.Session:
    message: pb.Session = convert.to_pb(session)
    return message


def _sessions(sessions: list[records.Session]) -> list[pb.Session]:
    return [_session(session) for session in sessions]


def _events(events: list[records.Event]) -> list[pb.Event]:
    return [convert.event_pb(event) for event in events]


def _scoped(scoped: ScopedView) -> pb.ScopedState:
    return pb.ScopedState(
        session=scoped.session, user=scoped.user, agent=scoped.agent, user_id=scoped.user_id
    )


def _deltas(deltas: Any) -> list[records.StateChanged]:
    """StateDelta messages as the core's changes (the same fields as StateChanged)."""
    return [
        records.StateChanged(
            scope=records.StateScope(delta.scope),
            user_id=delta.user_id,
            set=dict(delta.set),
            removed=list(delta.removed),
        )
        for delta in deltas
    ]


def _stored_record(record: records.StoredRecord) -> pb.StoredRecord:
    return pb.StoredRecord(
        kind=record.kind,
        namespace=record.namespace,
        key=record.key,
        parent_key=record.parent_key,
        metadata=record.metadata,
        payload=record.payload,
        labels=record.labels,
        erased=record.erased,
        session_id=record.session_id,
        sequence=record.sequence,
        payload_size=record.payload_size,
    )


def _record_input(record: pb.StoredRecord) -> records.StoredRecord:
    return records.StoredRecord(
        kind=record.kind,
        namespace=record.namespace,
        key=record.key,
        parent_key=record.parent_key,
        metadata=record.metadata,
        payload=record.payload,
        labels=dict(record.labels),
        erased=record.erased,
        session_id=record.session_id,
        sequence=record.sequence,
        payload_size=record.payload_size,
    )


def _label_filters(filters: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((f.name, tuple(f.values)) for f in filters)


def _optional(request: Any, name: str) -> Any:
    """A proto3 `optional` field's value, None when unset."""
    return getattr(request, name) if request.HasField(name) else None


def _record(kind: type[convert.R], message: Any) -> convert.R:
    """A request's message as a record (an unset one as its defaults, as pb reads it)."""
    return convert.to_record(kind, message)


def _agent_input(message: pb.Agent) -> records.Agent:
    """A request's agent as a record, its durations and times checked on the message
    first: the record keeps nanoseconds, in which a Duration out of normal form (nanos
    past a second, parts of opposite signs) would pass for another length of time."""
    resume, reset = message.settings.resume, message.settings.reset
    if resume.HasField("freshness_window"):
        validation.duration(
            "agent.settings.resume.freshness_window",
            resume.freshness_window,
            maximum_s=checks.MAX_POLICY_DURATION_S,
        )
    if reset.HasField("idle_after"):
        validation.duration(
            "agent.settings.reset.idle_after",
            reset.idle_after,
            minimum_s=checks.MIN_IDLE_AFTER_S,
            maximum_s=checks.MAX_POLICY_DURATION_S,
        )
    # Ignored, but an update logs the agent as given: only times every reader can read.
    for name in ("create_time", "update_time"):
        if message.HasField(name):
            validation.timestamp(f"agent.{name}", getattr(message, name))
    return _record(records.Agent, message)


class _Converted:
    """The messages of the events a watch just sent, by sequence: every watcher of an
    event streams the one message, converted once however many watch."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._by_sequence: dict[int, tuple[records.Event, pb.Event]] = {}

    def of(self, event: records.Event) -> pb.Event:
        found = self._by_sequence.get(event.sequence)
        if found is not None and found[0] is event:
            return found[1]
        message = convert.event_pb(event)
        if len(self._by_sequence) >= self._size:
            del self._by_sequence[next(iter(self._by_sequence))]  # the oldest
        self._by_sequence[event.sequence] = (event, message)
        return message


def _move_fields(move: Move) -> dict[str, Any]:
    """The fields RewindResponse and CheckoutResponse share."""
    summary = pb.MoveSummary(
        effects=[
            pb.MoveEffect(
                agent=effect.agent,
                session_id=effect.session_id,
                abandoned_count=effect.abandoned,
                restored_count=effect.restored,
            )
            for effect in move.listed
        ],
        truncated=move.changed > len(move.listed),
        changed_count=move.changed,
        abandoned_count=move.abandoned,
        restored_count=move.restored,
    )
    return {
        "record": None if move.record is None else convert.event_pb(move.record),
        "unchanged": move.unchanged,
        "to_sequence": move.to_sequence,
        "summary": summary,
    }


class SessionServicer(pb_grpc.SessionServiceServicer):
    def __init__(self, parts: Parts, requests: RequestStore) -> None:
        """Serves the rules `composition.build_parts` made."""
        self.requests = requests
        self.agents = parts.agents
        self.conversations = parts.conversations
        self.reads = parts.reads
        self.time_travel = parts.time_travel
        self.multi_agent = parts.multi_agent
        self.continuity = parts.continuity
        self.log_reads = parts.log_reads
        self.audit = parts.audit
        self.retraction = parts.retraction
        self.scoped_state = parts.scoped_state
        self.stored_records = parts.stored_records
        self.erasures = parts.erasures
        self._watched = _Converted()
        self.carried = CarriedCalls(
            pb.DESCRIPTOR.services_by_name["SessionService"],
            lambda server: pb_grpc.add_SessionServiceServicer_to_server(self, server),
            pb.CallStreamResponse,
        )

    async def CallStream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.CallStreamRequest], context: Context
    ) -> AsyncIterator[pb.CallStreamResponse]:
        """AppendEvents and PostToInbox carried over one stream (`switchboard.call_stream`)."""
        async for answer in self.carried.serve(request_iterator, context):
            yield answer  # type: ignore[misc]

    @mutation(lambda agent: pb.CreateAgentResponse(agent=_agent(agent)))
    async def CreateAgent(  # noqa: N802
        self, request: pb.CreateAgentRequest, context: Context, guard: RequestGuard | None
    ) -> records.Agent:
        return await self.agents.create_agent(_agent_input(request.agent), guard=guard)

    async def GetAgent(  # noqa: N802
        self, request: pb.GetAgentRequest, context: Context
    ) -> pb.GetAgentResponse:
        return pb.GetAgentResponse(agent=_agent(await self.agents.get_agent(request.name)))

    async def ListAgents(  # noqa: N802
        self, request: pb.ListAgentsRequest, context: Context
    ) -> pb.ListAgentsResponse:
        agents, token = await self.agents.list_agents(
            request.include_archived, request.page_size, request.page_token
        )
        return pb.ListAgentsResponse(agents=[_agent(a) for a in agents], next_page_token=token)

    @mutation(lambda agent: pb.UpdateAgentResponse(agent=_agent(agent)))
    async def UpdateAgent(  # noqa: N802
        self, request: pb.UpdateAgentRequest, context: Context, guard: RequestGuard | None
    ) -> records.Agent:
        return await self.agents.update_agent(
            _agent_input(request.agent), list(request.update_mask.paths), guard=guard
        )

    @mutation(lambda agent: pb.DeleteAgentResponse(agent=_agent(agent)))
    async def DeleteAgent(  # noqa: N802
        self, request: pb.DeleteAgentRequest, context: Context, guard: RequestGuard | None
    ) -> records.Agent:
        return await self.agents.delete_agent(request.name, guard=guard)

    @mutation(lambda agent: pb.PutMemoryResponse(agent=_agent(agent)))
    async def PutMemory(  # noqa: N802
        self, request: pb.PutMemoryRequest, context: Context, guard: RequestGuard | None
    ) -> records.Agent:
        return await self.agents.put_memory(request.agent, request.key, request.value, guard=guard)

    @mutation(lambda agent: pb.DeleteMemoryResponse(agent=_agent(agent)))
    async def DeleteMemory(  # noqa: N802
        self, request: pb.DeleteMemoryRequest, context: Context, guard: RequestGuard | None
    ) -> records.Agent:
        return await self.agents.delete_memory(request.agent, request.key, guard=guard)

    @mutation(lambda found: pb.ResolveSessionResponse(session=_session(found[0]), created=found[1]))
    async def ResolveSession(  # noqa: N802
        self, request: pb.ResolveSessionRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Session, bool]:
        source = _record(records.Source, request.source)
        return await self.conversations.resolve(
            request.agent,
            source,
            request.session_id,
            lookup_only=request.lookup_only,
            reopen_erased=request.reopen_erased,
            guard=guard,
        )

    @mutation(lambda session: pb.SpawnSessionResponse(session=_session(session)))
    async def SpawnSession(  # noqa: N802
        self, request: pb.SpawnSessionRequest, context: Context, guard: RequestGuard | None
    ) -> records.Session:
        grant = auth.current_grant()
        any_id = grant is None or grant.admin  # others choose ids in their agent's namespace
        return await self.conversations.spawn(
            request.agent,
            request.session_id,
            dict(request.temp_state),
            any_id=any_id,
            reopen_erased=request.reopen_erased,
            guard=guard,
        )

    async def GetSession(  # noqa: N802
        self, request: pb.GetSessionRequest, context: Context
    ) -> pb.GetSessionResponse:
        if request.include_state:
            found, scoped = await self.reads.get_session_with_state(
                request.agent, request.session_id
            )
            return pb.GetSessionResponse(session=_session(found), scoped_state=_scoped(scoped))
        session = await self.reads.get_session(request.agent, request.session_id)
        return pb.GetSessionResponse(session=_session(session))

    async def ListSessions(  # noqa: N802
        self, request: pb.ListSessionsRequest, context: Context
    ) -> pb.ListSessionsResponse:
        sessions, token = await self.reads.list_sessions(
            request.agent,
            request.status,
            request.transport,
            request.page_size,
            request.page_token,
            request.routing_key,
            request.user_id,
        )
        return pb.ListSessionsResponse(sessions=_sessions(sessions), next_page_token=token)

    @mutation(lambda session: pb.EndSessionResponse(session=_session(session)))
    async def EndSession(  # noqa: N802
        self, request: pb.EndSessionRequest, context: Context, guard: RequestGuard | None
    ) -> records.Session:
        return await self.conversations.end(
            request.agent, request.session_id, request.reason, guard=guard
        )

    @mutation(
        lambda pair: pb.ResetSessionResponse(ended=_session(pair[0]), session=_session(pair[1]))
    )
    async def ResetSession(  # noqa: N802
        self, request: pb.ResetSessionRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Session, records.Session]:
        return await self.conversations.reset(
            request.agent, request.session_id, request.reason, guard=guard
        )

    @mutation(
        lambda done: pb.AppendEventsResponse(
            events=_events(done[0]), version=done[1], sequences=done[2]
        )
    )
    async def AppendEvents(  # noqa: N802
        self, request: pb.AppendEventsRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[list[records.Event], int, list[int]]:
        expected = request.expected_version if request.HasField("expected_version") else None
        inputs = [
            records.EventInput(body=convert.input_body(event), size=event.ByteSize())
            for event in request.events
        ]
        return await self.conversations.append(
            request.agent,
            request.session_id,
            expected,
            inputs,
            echo=not request.sequences_only,
            deltas=_deltas(request.state_deltas),
            guard=guard,
        )

    @mutation(
        lambda posted: pb.PostToInboxResponse(
            event=convert.event_pb(posted[0]), duplicate=posted[1]
        )
    )
    async def PostToInbox(  # noqa: N802
        self, request: pb.PostToInboxRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Event, bool]:
        mark = post_mark(request.mark_resumable, request.resume_holder, request.reply_target)
        return await self.conversations.post_to_inbox(
            request.agent,
            request.session_id,
            _record(records.Message, request.message),
            mark,
            guard=guard,
        )

    async def GetHistory(  # noqa: N802
        self, request: pb.GetHistoryRequest, context: Context
    ) -> pb.GetHistoryResponse:
        messages, token = await self.reads.history(
            request.agent,
            request.session_id,
            request.after_sequence,
            request.limit,
            request.newest,
            request.include_abandoned,
            request.before_sequence,
            request.page_token,
        )
        return pb.GetHistoryResponse(
            messages=[convert.to_pb(message) for message in messages], next_page_token=token
        )

    async def GetSessionState(  # noqa: N802
        self, request: pb.GetSessionStateRequest, context: Context
    ) -> pb.GetSessionStateResponse:
        state, agent, scoped = await self.reads.state(
            request.agent, request.session_id, request.at_sequence
        )
        return pb.GetSessionStateResponse(
            state=convert.to_pb(state), agent=_agent(agent), scoped_state=_scoped(scoped)
        )

    @mutation(lambda sequence: pb.SnapshotSessionResponse(sequence=sequence))
    async def SnapshotSession(  # noqa: N802
        self, request: pb.SnapshotSessionRequest, context: Context, guard: RequestGuard | None
    ) -> int:
        return await self.reads.snapshot(request.agent, request.session_id, guard=guard)

    async def WatchEvents(  # noqa: N802
        self, request: pb.WatchEventsRequest, context: Context
    ) -> AsyncIterator[pb.WatchEventsResponse]:
        events = self.reads.watch(request.after_sequence, request.agent, request.session_id)
        async for event in events:
            yield pb.WatchEventsResponse(event=self._watched.of(event))

    @mutation(lambda checkpoint: pb.CreateCheckpointResponse(checkpoint=convert.to_pb(checkpoint)))
    async def CreateCheckpoint(  # noqa: N802
        self, request: pb.CreateCheckpointRequest, context: Context, guard: RequestGuard | None
    ) -> records.Checkpoint:
        return await self.time_travel.create_checkpoint(request.label, guard=guard)

    async def ListCheckpoints(  # noqa: N802
        self, request: pb.ListCheckpointsRequest, context: Context
    ) -> pb.ListCheckpointsResponse:
        checkpoints, token = await self.log_reads.checkpoints(
            request.page_size, request.page_token, request.min_sequence
        )
        return pb.ListCheckpointsResponse(
            checkpoints=[convert.to_pb(checkpoint) for checkpoint in checkpoints],
            next_page_token=token,
        )

    @mutation(lambda move: pb.RewindResponse(**_move_fields(move)))
    async def Rewind(  # noqa: N802
        self, request: pb.RewindRequest, context: Context, guard: RequestGuard | None
    ) -> Move:
        sequence = request.sequence if request.WhichOneof("target") == "sequence" else None
        return await self.time_travel.rewind(
            sequence,
            request.checkpoint,
            request.preview,
            request.empty_log,
            auth.current_principal(),
            guard=guard,
        )

    @mutation(lambda move: pb.CheckoutResponse(**_move_fields(move)))
    async def Checkout(  # noqa: N802
        self, request: pb.CheckoutRequest, context: Context, guard: RequestGuard | None
    ) -> Move:
        return await self.time_travel.checkout(
            request.sequence,
            request.preview,
            request.empty_log,
            auth.current_principal(),
            guard=guard,
        )

    @mutation(lambda done: pb.TruncateLogResponse(retained_from=done[0], deleted_count=done[1]))
    async def TruncateLog(  # noqa: N802
        self, request: pb.TruncateLogRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[int, int]:
        return await self.time_travel.truncate(request.below_sequence, guard=guard)

    async def ListLogEvents(  # noqa: N802
        self, request: pb.ListLogEventsRequest, context: Context
    ) -> pb.ListLogEventsResponse:
        page = await self.log_reads.events(
            LogQuery(
                after=request.after_sequence,
                before=request.before_sequence,
                agent=request.agent,
                session_id=request.session_id,
                event_types=tuple(request.event_types),
                branch=request.branch,
                newest=request.newest,
            ),
            request.page_size,
            request.page_token,
        )
        return pb.ListLogEventsResponse(
            entries=[
                pb.LogEntry(event=convert.event_pb(event), abandoned=abandoned)
                for event, abandoned in page.entries
            ],
            next_page_token=page.next_page_token,
            head_sequence=page.head,
            retained_from=page.retained_from,
        )

    @mutation(lambda event: pb.RecordOperatorActionResponse(event=convert.event_pb(event)))
    async def RecordOperatorAction(  # noqa: N802
        self, request: pb.RecordOperatorActionRequest, context: Context, guard: RequestGuard | None
    ) -> records.Event:
        return await self.audit.record(
            auth.current_principal(), request.action, request.subject, request.detail, guard=guard
        )

    @mutation(lambda session: pb.ForkSessionResponse(session=_session(session)))
    async def ForkSession(  # noqa: N802
        self, request: pb.ForkSessionRequest, context: Context, guard: RequestGuard | None
    ) -> records.Session:
        narrowing = _record(records.Narrowing, request.narrowing)
        return await self.multi_agent.fork(
            request.agent, request.session_id, request.at_sequence, narrowing, guard=guard
        )

    @mutation(
        lambda found: pb.DelegateResponse(
            session=_session(found[0]), created=found[1], duplicate=found[2]
        )
    )
    async def Delegate(  # noqa: N802
        self, request: pb.DelegateRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Session, bool, bool]:
        task = _record(records.Message, request.task)
        return await self.multi_agent.delegate(
            request.agent, request.session_id, request.to_agent, task, request.context, guard=guard
        )

    @mutation(
        lambda posted: pb.SendToPeerResponse(event=convert.event_pb(posted[0]), duplicate=posted[1])
    )
    async def SendToPeer(  # noqa: N802
        self, request: pb.SendToPeerRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Event, bool]:
        source = (
            _record(records.Source, request.source)
            if request.WhichOneof("target") == "source"
            else None
        )
        return await self.multi_agent.send_to_peer(
            request.agent,
            request.session_id,
            request.to_agent,
            source,
            request.to_session_id,
            _record(records.Message, request.message),
            guard=guard,
        )

    @mutation(
        lambda done: pb.CheckPermissionResponse(decision=convert.to_pb(done[0]), sequence=done[1])
    )
    async def CheckPermission(  # noqa: N802
        self, request: pb.CheckPermissionRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.PermissionChecked, int]:
        return await self.multi_agent.check(
            request.agent, request.session_id, request.action, request.resource, guard=guard
        )

    @mutation(lambda session: pb.MarkResumableResponse(session=_session(session)))
    async def MarkResumable(  # noqa: N802
        self, request: pb.MarkResumableRequest, context: Context, guard: RequestGuard | None
    ) -> records.Session:
        return await self.continuity.mark(
            request.agent,
            request.session_id,
            request.pending,
            request.holder,
            request.reply_target,
            guard=guard,
        )

    @mutation(lambda session: pb.SuspendSessionResponse(session=_session(session)))
    async def SuspendSession(  # noqa: N802
        self, request: pb.SuspendSessionRequest, context: Context, guard: RequestGuard | None
    ) -> records.Session:
        return await self.continuity.suspend(
            request.agent, request.session_id, request.suspended, guard=guard
        )

    async def ListResumable(  # noqa: N802
        self, request: pb.ListResumableRequest, context: Context
    ) -> pb.ListResumableResponse:
        fresh, stale = await self.continuity.list_resumable(request.agent)
        return pb.ListResumableResponse(sessions=_sessions(fresh), stale=_sessions(stale))

    @mutation(lambda expired: pb.ExpireResumableResponse(expired=_sessions(expired)))
    async def ExpireResumable(  # noqa: N802
        self, request: pb.ExpireResumableRequest, context: Context, guard: RequestGuard | None
    ) -> list[records.Session]:
        return await self.continuity.expire_resumable(request.agent, guard=guard)

    # -- what agent frameworks store (issue 23) -------------------------------------------

    @mutation(
        lambda done: pb.RetractMessagesResponse(
            messages=[convert.to_pb(message) for message in done[0]],
            version=done[1],
            sequence=done[2],
            session_id=done[3],
        )
    )
    async def RetractMessages(  # noqa: N802
        self, request: pb.RetractMessagesRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[list[records.QueuedMessage], int, int, str]:
        return await self.retraction.retract(
            request.agent,
            request.session_id,
            _optional(request, "expected_version"),
            request.newest_count,
            list(request.sequences),
            guard=guard,
        )

    @mutation(
        lambda done: pb.UpdateStateResponse(sequences=done[0], version=done[1], session_id=done[2])
    )
    async def UpdateState(  # noqa: N802
        self, request: pb.UpdateStateRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[list[int], int, str]:
        return await self.scoped_state.update(
            request.agent,
            request.session_id,
            _optional(request, "expected_version"),
            _deltas(request.deltas),
            guard=guard,
        )

    async def GetUserState(  # noqa: N802
        self, request: pb.GetUserStateRequest, context: Context
    ) -> pb.GetUserStateResponse:
        state, user_id = await self.scoped_state.user_state(request.agent, request.user_id)
        return pb.GetUserStateResponse(state=state, user_id=user_id)

    @mutation(
        lambda done: pb.PutRecordsResponse(sequence=done[0], version=done[1], session_id=done[2])
    )
    async def PutRecords(  # noqa: N802
        self, request: pb.PutRecordsRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[int, int, str]:
        return await self.stored_records.put(
            request.agent,
            request.session_id,
            [_record_input(record) for record in request.records],
            request.versioned,
            _optional(request, "expected_version"),
            guard=guard,
        )

    async def GetRecord(  # noqa: N802
        self, request: pb.GetRecordRequest, context: Context
    ) -> pb.GetRecordResponse:
        record, children = await self.stored_records.get(
            request.agent,
            request.session_id,
            request.kind,
            request.namespace,
            request.key,
            request.children_kind,
        )
        return pb.GetRecordResponse(
            record=_stored_record(record), children=[_stored_record(c) for c in children]
        )

    async def ListRecords(  # noqa: N802
        self, request: pb.ListRecordsRequest, context: Context
    ) -> pb.ListRecordsResponse:
        query = RecordQuery(
            agent=request.agent,
            session_id=request.session_id,
            kind=request.kind,
            namespace=_optional(request, "namespace"),
            keys=tuple(request.keys),
            parent_key=_optional(request, "parent_key"),
            labels=_label_filters(request.labels),
        )
        found, token = await self.stored_records.listing(
            ListRequest(
                query=query,
                before_key=request.before_key,
                metadata_filter=tuple(sorted(request.metadata_filter.items())),
                include_payloads=request.include_payloads,
                page_size=request.page_size,
                page_token=request.page_token,
            )
        )
        return pb.ListRecordsResponse(
            records=[_stored_record(record) for record in found], next_page_token=token
        )

    @mutation(
        lambda done: pb.EraseSessionResponse(
            erasure=convert.event_pb(done[0]), erased_events=done[1]
        )
    )
    async def EraseSession(  # noqa: N802
        self, request: pb.EraseSessionRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Event, int]:
        return await self.erasures.erase_session(
            request.agent, request.session_id, auth.current_principal(), guard=guard
        )

    @mutation(
        lambda done: pb.EraseRecordsResponse(
            erasure=None if done[0] is None else convert.event_pb(done[0]),
            erased_records=done[1],
            session_ids=done[2],
        )
    )
    async def EraseRecords(  # noqa: N802
        self, request: pb.EraseRecordsRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[records.Event | None, int, list[str]]:
        selection = RecordSelection(
            kind=request.kind,
            namespace=_optional(request, "namespace"),
            keys=tuple(request.keys),
            labels=_label_filters(request.labels),
            all=request.all,
            keep_newest=_optional(request, "keep_newest_per_namespace"),
            children_kind=request.children_kind,
        )
        return await self.erasures.erase_records(
            request.agent, request.session_id, selection, auth.current_principal(), guard=guard
        )
