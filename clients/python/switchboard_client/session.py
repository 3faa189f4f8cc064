"""A typed, synchronous client for the SessionService (agents, sessions, the event log).

A gateway resolves each incoming message to its session, appends the turn's
events, reads history and state to build the next prompt, and may watch the
log live. This client wraps the generated stub so that every unary call has a
deadline, transient outages of idempotent calls are retried by gRPC itself,
and every failure surfaces as one exception type, `SwitchboardError`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self

import grpc
from google.protobuf import field_mask_pb2

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_client import _framework
from switchboard_client._base import MUTATION_ATTEMPTS, BaseClient, service_config
from switchboard_client.errors import SwitchboardError, from_rpc_error

SERVICE_NAME = "switchboard.session.v1.SessionService"

#: Reads: safe to send twice.
READ_METHODS: tuple[str, ...] = (
    "GetAgent",
    "ListAgents",
    "GetSession",
    "ListSessions",
    "GetHistory",
    "GetSessionState",
    "ListCheckpoints",
    "ListLogEvents",
    "ListResumable",
    "GetUserState",
    "GetRecord",
    "ListRecords",
)
#: Writes: each carries a request id (one per logical call, the same on every
#: retry), so the server answers a retry of a committed call from its record
#: (created=True stays True, an append is not made twice). `BaseClient._call`
#: sets the id and retries them with a fresh deadline.
REQUEST_ID_METHODS: tuple[str, ...] = (
    "CreateAgent",
    "UpdateAgent",
    "DeleteAgent",
    "PutMemory",
    "DeleteMemory",
    "ResolveSession",
    "SpawnSession",
    "EndSession",
    "ResetSession",
    "AppendEvents",
    "PostToInbox",
    "SnapshotSession",
    "CreateCheckpoint",
    "Rewind",
    "Checkout",
    "TruncateLog",
    "ForkSession",
    "Delegate",
    "SendToPeer",
    "CheckPermission",
    "MarkResumable",
    "SuspendSession",
    "ExpireResumable",
    "RecordOperatorAction",
    "RetractMessages",
    "UpdateState",
    "PutRecords",
    "EraseSession",
    "EraseRecords",
)
#: Retried on UNAVAILABLE by the channel: the reads and the writes with request ids.
RETRYABLE_METHODS: tuple[str, ...] = READ_METHODS + REQUEST_ID_METHODS

#: Long-lived server streams: no timeout and no retry from the service config.
STREAMING_METHODS: tuple[str, ...] = ("WatchEvents",)

#: gRPC service config: a timeout for every unary method of the service (the nameless
#: entry covers methods added later, which stay unretried until reviewed), a retry on
#: UNAVAILABLE for the reads and the writes with request ids, and no timeout for
#: WatchEvents.
SERVICE_CONFIG: dict[str, Any] = service_config(
    SERVICE_NAME, RETRYABLE_METHODS, unbounded=STREAMING_METHODS
)


class _ResponseStream(Protocol):
    def __next__(self) -> pb.WatchEventsResponse: ...

    def cancel(self) -> bool: ...


class EventStream(Iterator[pb.Event]):
    """Log events of a `watch`, as they commit; blocks while there are none.

    `cancel()` (from any thread) ends the iteration quietly; used as a context
    manager, the stream is cancelled on exit. Any other failure raises
    `SwitchboardError`.
    """

    def __init__(self, call: _ResponseStream) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> pb.Event:
        try:
            return next(self._call).event
        except grpc.RpcError as error:
            cancelled = isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.CANCELLED
            if cancelled and self._cancelled:
                raise StopIteration from None
            raise from_rpc_error(error) from error

    def cancel(self) -> None:
        """Ends the stream; a blocked `next()` returns (StopIteration) at once."""
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()


class SessionClient(BaseClient):
    """The SessionService for one gateway process (thread-safe, like its channel).

    Every method raises `SwitchboardError` on failure. Methods take and return the
    generated messages of `switchboard.session.v1.session_service_pb2`.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        channel: grpc.Channel | None = None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        """`target` is "host:port"; pass `channel` to bring your own (TLS, interceptors),
        `token` for a server with authentication on.

        A channel passed in stays the caller's: `close()` leaves it open.
        """
        super().__init__(
            target,
            config=SERVICE_CONFIG,
            timeout_s=timeout_s,
            channel=channel,
            token=token,
            mutation_attempts=mutation_attempts,
        )
        self._stub = pb_grpc.SessionServiceStub(self._channel)

    # -- agents ---------------------------------------------------------------------------

    def create_agent(self, name: str, *, request_id: str = "", **fields: Any) -> pb.Agent:
        """Creates an agent; `fields` are other `Agent` fields (display_name, permissions,
        peers, settings, memory, parent, ...)."""
        request = pb.CreateAgentRequest(agent=pb.Agent(name=name, **fields))
        return self._call(self._stub.CreateAgent, request, request_id=request_id).agent

    def get_agent(self, name: str) -> pb.Agent:
        """Reads an agent, memory included."""
        return self._call(self._stub.GetAgent, pb.GetAgentRequest(name=name)).agent

    def list_agents(
        self, *, include_archived: bool = False, page_size: int = 0
    ) -> Iterator[pb.Agent]:
        """Every agent by name (memory omitted), fetching pages lazily as iteration goes."""
        request = pb.ListAgentsRequest(include_archived=include_archived, page_size=page_size)
        for page in self._pages(self._stub.ListAgents, request):
            yield from page.agents

    def update_agent(
        self, agent: pb.Agent, paths: Sequence[str], *, request_id: str = ""
    ) -> pb.Agent:
        """Changes the fields of `agent` named by `paths` (e.g. "display_name",
        "settings.routing"); `agent.name` selects the agent."""
        request = pb.UpdateAgentRequest(
            agent=agent, update_mask=field_mask_pb2.FieldMask(paths=paths)
        )
        return self._call(self._stub.UpdateAgent, request, request_id=request_id).agent

    def delete_agent(self, name: str) -> pb.Agent:
        """Archives an agent (kept in the log, no longer routable); repeating is harmless."""
        return self._call(self._stub.DeleteAgent, pb.DeleteAgentRequest(name=name)).agent

    def put_memory(self, agent: str, key: str, value: str, *, request_id: str = "") -> pb.Agent:
        """Sets one memory entry of an agent (shared by all its sessions)."""
        request = pb.PutMemoryRequest(agent=agent, key=key, value=value)
        return self._call(self._stub.PutMemory, request, request_id=request_id).agent

    def delete_memory(self, agent: str, key: str, *, request_id: str = "") -> pb.Agent:
        """Removes one memory entry of an agent."""
        request = pb.DeleteMemoryRequest(agent=agent, key=key)
        return self._call(self._stub.DeleteMemory, request, request_id=request_id).agent

    # -- sessions -------------------------------------------------------------------------

    def resolve(
        self,
        agent: str,
        *,
        transport: str,
        conversation_id: str = "",
        chat_type: pb.ChatType.ValueType | None = None,
        chat_id: str = "",
        thread_id: str = "",
        user_id: str = "",
        scope_id: str = "",
        request_id: str = "",
        lookup_only: bool = False,
        reopen_erased: bool = False,
    ) -> pb.ResolveSessionResponse:
        """The session a message from this source belongs to, created on first contact.

        Non-chat transports ("web", "cron", "repl", "peer", and the agent frameworks'
        "adk", "openai_agents", "langgraph") need `conversation_id` (and may name the
        conversation's `user_id`); chat platforms need `chat_type` and the chat's ids.
        `lookup_only`: never create; a source without a session raises NOT_FOUND.
        `reopen_erased`: open a new session for a conversation whose session was
        erased (otherwise FAILED_PRECONDITION, SESSION_ERASED).
        """
        source = pb.Source(
            transport=transport,
            conversation_id=conversation_id,
            chat_type=pb.CHAT_TYPE_UNSPECIFIED if chat_type is None else chat_type,
            chat_id=chat_id,
            thread_id=thread_id,
            user_id=user_id,
            scope_id=scope_id,
        )
        request = pb.ResolveSessionRequest(
            agent=agent, source=source, lookup_only=lookup_only, reopen_erased=reopen_erased
        )
        return self._call(self._stub.ResolveSession, request, request_id=request_id)

    def join(self, agent: str, session_id: str) -> pb.Session:
        """An existing open session of the agent (NOT_FOUND otherwise); creates nothing."""
        request = pb.ResolveSessionRequest(agent=agent, session_id=session_id)
        return self._call(self._stub.ResolveSession, request).session

    def spawn(
        self,
        agent: str,
        session_id: str = "",
        *,
        temp_state: Mapping[str, str] | None = None,
        request_id: str = "",
        reopen_erased: bool = False,
    ) -> pb.Session:
        """Creates a session without a routing key; `session_id` "" generates one.
        `reopen_erased`: take an id whose session was erased."""
        request = pb.SpawnSessionRequest(
            agent=agent,
            session_id=session_id,
            temp_state=temp_state or {},
            reopen_erased=reopen_erased,
        )
        return self._call(self._stub.SpawnSession, request, request_id=request_id).session

    def get_session(self, agent: str, session_id: str) -> pb.Session:
        """Reads a session's summary."""
        request = pb.GetSessionRequest(agent=agent, session_id=session_id)
        return self._call(self._stub.GetSession, request).session

    def get_session_with_state(self, agent: str, session_id: str) -> pb.GetSessionResponse:
        """A session's summary and the scoped state it sees (`scoped_state`: its own, its
        user's, its agent's; values are JSON text, `state_values` decodes them)."""
        request = pb.GetSessionRequest(agent=agent, session_id=session_id, include_state=True)
        return self._call(self._stub.GetSession, request)

    def list_sessions(
        self,
        agent: str,
        *,
        status: pb.SessionStatus.ValueType = pb.SESSION_STATUS_UNSPECIFIED,
        transport: str = "",
        page_size: int = 0,
        user_id: str = "",
    ) -> Iterator[pb.Session]:
        """The agent's sessions, newest first, fetching pages lazily as iteration goes;
        `user_id`: only that user's (Source.user_id)."""
        request = pb.ListSessionsRequest(
            agent=agent, status=status, transport=transport, page_size=page_size, user_id=user_id
        )
        for page in self._pages(self._stub.ListSessions, request):
            yield from page.sessions

    def end(
        self, agent: str, session_id: str, reason: str = "", *, request_id: str = ""
    ) -> pb.Session:
        """Ends a session; its routing key no longer resolves to it. Repeating is harmless."""
        request = pb.EndSessionRequest(agent=agent, session_id=session_id, reason=reason)
        return self._call(self._stub.EndSession, request, request_id=request_id).session

    def reset(
        self, agent: str, session_id: str, reason: str = "", *, request_id: str = ""
    ) -> pb.ResetSessionResponse:
        """The explicit reset ("/new"): ends the session, its routing key gets a fresh one."""
        request = pb.ResetSessionRequest(agent=agent, session_id=session_id, reason=reason)
        return self._call(self._stub.ResetSession, request, request_id=request_id)

    def mark_resumable(
        self,
        agent: str,
        session_id: str,
        pending: bool = True,
        *,
        holder: str = "",
        reply_target: bytes = b"",
        request_id: str = "",
    ) -> pb.Session:
        """Marks the session's turn as interrupted (or clears the mark with False).

        `holder` names the process running the turn (a gateway passes its ledger
        instance id), so that others leave the turn alone while it lives;
        `reply_target` is where its reply goes, sealed (`switchboard_client.reply_targets`),
        kept with the mark as `Session.reply_target`.
        """
        request = pb.MarkResumableRequest(
            agent=agent,
            session_id=session_id,
            pending=pending,
            holder=holder,
            reply_target=reply_target,
        )
        return self._call(self._stub.MarkResumable, request, request_id=request_id).session

    def suspend(
        self, agent: str, session_id: str, suspended: bool = True, *, request_id: str = ""
    ) -> pb.Session:
        """Suspends the session (never auto-resumed), or lifts the suspension with False."""
        request = pb.SuspendSessionRequest(agent=agent, session_id=session_id, suspended=suspended)
        return self._call(self._stub.SuspendSession, request, request_id=request_id).session

    def list_resumable(self, agent: str) -> pb.ListResumableResponse:
        """Interrupted sessions fresh enough to resume (`sessions`), and the stale ones
        (`stale`, not to be continued). A read: `expire_resumable` resets the stale."""
        request = pb.ListResumableRequest(agent=agent)
        return self._call(self._stub.ListResumable, request)

    def expire_resumable(self, agent: str, *, request_id: str = "") -> list[pb.Session]:
        """Resets the agent's stale interrupted sessions; returns them, ended."""
        request = pb.ExpireResumableRequest(agent=agent)
        return list(self._call(self._stub.ExpireResumable, request, request_id=request_id).expired)

    # -- the conversation -----------------------------------------------------------------

    def append(
        self,
        agent: str,
        session_id: str,
        *events: pb.SessionEventInput,
        expected_version: int | None = None,
        request_id: str = "",
        sequences_only: bool = False,
        state_deltas: Sequence[pb.StateDelta] = (),
    ) -> pb.AppendEventsResponse:
        """Appends events atomically (all or none).

        With `expected_version`, ABORTED (reason VERSION_MISMATCH, the current version
        in `metadata["version"]`) when the session moved on meanwhile. An append whose
        echo would not fit one answer is refused unwritten (INVALID_ARGUMENT,
        ANSWER_TOO_LARGE); with `sequences_only` the answer carries the version and
        `sequences`, not the events, and such an append goes through. `state_deltas`
        (`state_delta(...)`) change scoped state in the same transaction.
        """
        request = pb.AppendEventsRequest(
            agent=agent,
            session_id=session_id,
            events=events,
            sequences_only=sequences_only,
            state_deltas=state_deltas,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return self._call(self._stub.AppendEvents, request, request_id=request_id)

    def append_message(
        self,
        agent: str,
        session_id: str,
        role: pb.Role.ValueType,
        content: str,
        *,
        expected_version: int | None = None,
        **message_fields: Any,
    ) -> pb.AppendEventsResponse:
        """Appends one history message; `message_fields` are other `Message` fields."""
        event = pb.SessionEventInput(
            message_appended=pb.MessageAppended(
                message=pb.Message(role=role, content=content, **message_fields)
            )
        )
        return self.append(agent, session_id, event, expected_version=expected_version)

    def post_to_inbox(
        self, agent: str, session_id: str, message: pb.Message, *, request_id: str = ""
    ) -> pb.Event:
        """Puts a message into the session's inbox; never conflicts with a running turn."""
        request = pb.PostToInboxRequest(agent=agent, session_id=session_id, message=message)
        return self._call(self._stub.PostToInbox, request, request_id=request_id).event

    def post_message(
        self,
        agent: str,
        session_id: str,
        message: pb.Message,
        *,
        mark_holder: str | None = None,
        reply_target: bytes = b"",
        request_id: str = "",
    ) -> pb.PostToInboxResponse:
        """`post_to_inbox`'s whole answer: its `duplicate` is set when the session had
        accepted the message's message_ref before (nothing was written; `event` is the
        first post's). `mark_holder`: also set the resume mark naming it, in the same
        transaction (how a gateway starts a turn); `reply_target`: with it, the sealed
        target the mark keeps (`reply_targets.ReplySealer.seal`)."""
        request = pb.PostToInboxRequest(
            agent=agent,
            session_id=session_id,
            message=message,
            mark_resumable=mark_holder is not None,
            resume_holder=mark_holder or "",
            reply_target=reply_target,
        )
        return self._call(self._stub.PostToInbox, request, request_id=request_id)

    def history(
        self,
        agent: str,
        session_id: str,
        *,
        after: int = 0,
        limit: int = 0,
        newest: bool = False,
        include_abandoned: bool = False,
        before: int = 0,
    ) -> list[pb.QueuedMessage]:
        """A window of the history, oldest first: the oldest `limit` messages after
        sequence `after` (and before `before`, 0: none), or with `newest` the newest
        `limit` (0: server default). One page: `history_pages` follows the tokens."""
        return list(
            self.history_page(
                agent,
                session_id,
                after=after,
                limit=limit,
                newest=newest,
                include_abandoned=include_abandoned,
                before=before,
            ).messages
        )

    def history_page(
        self,
        agent: str,
        session_id: str,
        *,
        after: int = 0,
        limit: int = 0,
        newest: bool = False,
        include_abandoned: bool = False,
        before: int = 0,
        page_token: str = "",
    ) -> pb.GetHistoryResponse:
        """One page of the history with its `next_page_token` (older messages with
        `newest`, newer ones without)."""
        request = pb.GetHistoryRequest(
            agent=agent,
            session_id=session_id,
            after_sequence=after,
            limit=limit,
            newest=newest,
            include_abandoned=include_abandoned,
            before_sequence=before,
            page_token=page_token,
        )
        return self._call(self._stub.GetHistory, request)

    def history_pages(
        self, agent: str, session_id: str, *, newest: bool = False, limit: int = 0
    ) -> Iterator[pb.GetHistoryResponse]:
        """Every page of the history, fetched lazily: oldest first, or with `newest`
        from the newest page backwards (each page's messages still oldest first)."""
        request = pb.GetHistoryRequest(
            agent=agent, session_id=session_id, newest=newest, limit=limit
        )
        yield from self._pages(self._stub.GetHistory, request)

    def state(self, agent: str, session_id: str) -> pb.GetSessionStateResponse:
        """The session's state (summary, inbox, outbox, task, temp state) and its agent."""
        request = pb.GetSessionStateRequest(agent=agent, session_id=session_id)
        return self._call(self._stub.GetSessionState, request)

    def snapshot(self, agent: str, session_id: str, *, request_id: str = "") -> int:
        """Writes snapshots of the session and its agent now; returns the sequence."""
        request = pb.SnapshotSessionRequest(agent=agent, session_id=session_id)
        return self._call(self._stub.SnapshotSession, request, request_id=request_id).sequence

    def watch(
        self,
        after: int = 0,
        agent: str = "",
        session_id: str = "",
        *,
        timeout_s: float | None = None,
    ) -> EventStream:
        """Log events after sequence `after`, then live ones, filtered by agent or session.

        No deadline unless `timeout_s` is given: the stream lasts until cancelled
        (`EventStream.cancel()` or leaving its `with` block) or the server stops.
        """
        request = pb.WatchEventsRequest(after_sequence=after, agent=agent, session_id=session_id)
        return EventStream(
            self._stub.WatchEvents(request, timeout=timeout_s, metadata=self._metadata)
        )

    # -- what agent frameworks store ------------------------------------------------------

    def retract_messages(
        self,
        agent: str,
        session_id: str,
        *,
        newest_count: int = 0,
        sequences: Sequence[int] = (),
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.RetractMessagesResponse:
        """Takes the newest `newest_count` messages (or those at `sequences`) out of the
        history in one logged, versioned change; answers them (none: nothing was there,
        nothing written). A rewind past it brings them back."""
        request = _framework.retract_request(
            agent, session_id, newest_count, sequences, expected_version
        )
        return self._call(self._stub.RetractMessages, request, request_id=request_id)

    def update_state(
        self,
        agent: str,
        deltas: Sequence[pb.StateDelta],
        *,
        session_id: str = "",
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.UpdateStateResponse:
        """Applies scoped state changes (`state_delta(...)`) atomically, without events;
        SESSION-scoped ones need `session_id`."""
        request = _framework.update_state_request(agent, deltas, session_id, expected_version)
        return self._call(self._stub.UpdateState, request, request_id=request_id)

    def user_state(self, agent: str, user_id: str) -> pb.GetUserStateResponse:
        """The state the agent keeps for one user (JSON text values: `state_values`)."""
        request = pb.GetUserStateRequest(agent=agent, user_id=user_id)
        return self._call(self._stub.GetUserState, request)

    def put_records(
        self,
        agent: str,
        session_id: str,
        records: Sequence[pb.StoredRecord],
        *,
        versioned: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.PutRecordsResponse:
        """Stores records in one logged event; unversioned unless `versioned`."""
        request = _framework.put_records_request(
            agent, session_id, records, versioned, expected_version
        )
        return self._call(self._stub.PutRecords, request, request_id=request_id)

    def get_record(
        self,
        agent: str,
        session_id: str,
        kind: str,
        *,
        namespace: str = "",
        key: str = "",
        children_kind: str = "",
    ) -> pb.GetRecordResponse:
        """A record by key (or "" the newest of the namespace), with its payload and,
        given `children_kind`, its children; NOT_FOUND (RECORD_NOT_FOUND) if none."""
        request = pb.GetRecordRequest(
            agent=agent,
            session_id=session_id,
            kind=kind,
            namespace=namespace,
            key=key,
            children_kind=children_kind,
        )
        return self._call(self._stub.GetRecord, request)

    def list_records(
        self,
        agent: str,
        kind: str,
        *,
        session_id: str = "",
        namespace: str | None = None,
        keys: Sequence[str] = (),
        parent_key: str | None = None,
        before_key: str = "",
        labels: _framework.Labels | None = None,
        metadata_filter: Mapping[str, Any] | None = None,
        include_payloads: bool = False,
        page_size: int = 0,
    ) -> Iterator[pb.StoredRecord]:
        """Records of a kind, newest put first, in a session (or every session of the
        agent), fetching pages lazily; `labels` maps a label to its accepted values,
        `metadata_filter` a metadata key to the value it must have."""
        request = _framework.list_records_request(
            agent,
            kind,
            session_id=session_id,
            namespace=namespace,
            keys=keys,
            parent_key=parent_key,
            before_key=before_key,
            labels=labels,
            metadata_filter=metadata_filter,
            include_payloads=include_payloads,
            page_size=page_size,
        )
        for page in self._pages(self._stub.ListRecords, request):
            yield from page.records

    def erase_session(
        self, agent: str, session_id: str, *, request_id: str = ""
    ) -> pb.EraseSessionResponse:
        """Erases a session for good: its content leaves the log (tombstones keep the
        sequence), snapshots, projections and remembered answers; no rewind or
        checkout brings it back."""
        request = pb.EraseSessionRequest(agent=agent, session_id=session_id)
        return self._call(self._stub.EraseSession, request, request_id=request_id)

    def erase_records(
        self,
        agent: str,
        kind: str,
        *,
        session_id: str = "",
        namespace: str | None = None,
        keys: Sequence[str] = (),
        labels: _framework.Labels | None = None,
        all_records: bool = False,
        keep_newest_per_namespace: int | None = None,
        children_kind: str = "",
        request_id: str = "",
    ) -> pb.EraseRecordsResponse:
        """Erases records of a kind (exactly one of `keys`, `labels`, `all_records`,
        `keep_newest_per_namespace`), with their children of `children_kind`."""
        request = _framework.erase_records_request(
            agent,
            kind,
            session_id=session_id,
            namespace=namespace,
            keys=keys,
            labels=labels,
            all_records=all_records,
            keep_newest_per_namespace=keep_newest_per_namespace,
            children_kind=children_kind,
        )
        return self._call(self._stub.EraseRecords, request, request_id=request_id)

    # -- time travel ----------------------------------------------------------------------

    def create_checkpoint(self, label: str, *, request_id: str = "") -> pb.Checkpoint:
        """Names the current head of the log (ALREADY_EXISTS for a taken label)."""
        request = pb.CreateCheckpointRequest(label=label)
        return self._call(self._stub.CreateCheckpoint, request, request_id=request_id).checkpoint

    def list_checkpoints(self, *, page_size: int = 0) -> list[pb.Checkpoint]:
        """All checkpoints, oldest first (fetched page by page)."""
        request = pb.ListCheckpointsRequest(page_size=page_size)
        pages = self._pages(self._stub.ListCheckpoints, request)
        return [checkpoint for page in pages for checkpoint in page.checkpoints]

    def list_log_events(
        self,
        *,
        after: int = 0,
        before: int = 0,
        agent: str = "",
        session_id: str = "",
        event_types: Sequence[str] = (),
        branch: pb.LogBranch.ValueType = pb.LOG_BRANCH_UNSPECIFIED,
        page_size: int = 0,
    ) -> Iterator[pb.LogEntry]:
        """The global log in sequence order, filtered (admin only), fetching pages
        lazily as iteration goes."""
        request = pb.ListLogEventsRequest(
            after_sequence=after,
            before_sequence=before,
            agent=agent,
            session_id=session_id,
            event_types=event_types,
            branch=branch,
            page_size=page_size,
        )
        for page in self._pages(self._stub.ListLogEvents, request):
            yield from page.entries

    def rewind(self, to: int | str, *, empty_log: bool = False, request_id: str = "") -> pb.Event:
        """Moves every agent and session back to a sequence (int) or checkpoint (label).

        Returns the rewind record; everything after the target is abandoned. With
        nothing to abandon nothing is written and the record is empty (sequence 0):
        `preview_rewind` tells in advance. Sequence 0 is the empty log, every agent
        and session abandoned: the server goes there only with `empty_log=True`.
        """
        request = _rewind_request(to, empty_log)
        return self._call(self._stub.Rewind, request, request_id=request_id).record

    def preview_rewind(self, to: int | str, *, empty_log: bool = False) -> pb.RewindResponse:
        """What `rewind(to)` would abandon, per agent and session; writes nothing."""
        request = _rewind_request(to, empty_log)
        request.preview = True
        return self._call(self._stub.Rewind, request)

    def checkout(self, sequence: int, *, empty_log: bool = False, request_id: str = "") -> pb.Event:
        """Like `rewind`, to any retained sequence, abandoned branches included;
        sequence 0 (the empty log) only with `empty_log=True`."""
        request = pb.CheckoutRequest(sequence=sequence, empty_log=empty_log)
        return self._call(self._stub.Checkout, request, request_id=request_id).record

    def preview_checkout(self, sequence: int, *, empty_log: bool = False) -> pb.CheckoutResponse:
        """What `checkout(sequence)` would abandon and restore; writes nothing."""
        request = pb.CheckoutRequest(sequence=sequence, preview=True, empty_log=empty_log)
        return self._call(self._stub.Checkout, request)

    def truncate_log(self, below_sequence: int, *, request_id: str = "") -> pb.TruncateLogResponse:
        """Deletes log events below a sequence (at least 1) that snapshots made
        unnecessary."""
        request = pb.TruncateLogRequest(below_sequence=below_sequence)
        return self._call(self._stub.TruncateLog, request, request_id=request_id)

    # -- multi-agent ----------------------------------------------------------------------

    def fork(
        self,
        agent: str,
        session_id: str,
        *,
        at_sequence: int = 0,
        narrowing: Sequence[pb.PermissionRule] = (),
        request_id: str = "",
    ) -> pb.Session:
        """Branches a session (history and state at `at_sequence`, 0: now) under the same
        agent; `narrowing` rules restrict the fork further."""
        request = pb.ForkSessionRequest(
            agent=agent,
            session_id=session_id,
            at_sequence=at_sequence,
            narrowing=pb.Narrowing(rules=narrowing),
        )
        return self._call(self._stub.ForkSession, request, request_id=request_id).session

    def delegate(
        self,
        agent: str,
        session_id: str,
        to_agent: str,
        task: pb.Message,
        *,
        context: str = "",
        request_id: str = "",
    ) -> pb.DelegateResponse:
        """Hands `task` to a peer agent's session for the peer conversation
        "<agent>:<context>" sent by `agent` (gated by "peer.delegate"); the same context
        resumes the same session. An empty task sender is stored as "agent:<agent>"."""
        request = pb.DelegateRequest(
            agent=agent, session_id=session_id, to_agent=to_agent, task=task, context=context
        )
        return self._call(self._stub.Delegate, request, request_id=request_id)

    def send_to_peer(
        self,
        agent: str,
        session_id: str,
        to_agent: str,
        message: pb.Message,
        *,
        to_session_id: str = "",
        source: pb.Source | None = None,
        request_id: str = "",
    ) -> pb.Event:
        """Puts `message` into a peer agent's session inbox (gated by "peer.send"):
        the session `to_session_id`, or the one `source` routes to (a peer source is
        `agent`'s own thread: the service sets its from_agent). A sender naming another
        agent is INVALID_ARGUMENT; an empty one is stored as "agent:<agent>"."""
        request = pb.SendToPeerRequest(
            agent=agent, session_id=session_id, to_agent=to_agent, message=message
        )
        if source is not None:
            request.source.CopyFrom(source)
        else:
            request.to_session_id = to_session_id
        return self._call(self._stub.SendToPeer, request, request_id=request_id).event

    def check_permission(
        self, agent: str, session_id: str, action: str, resource: str = "", *, request_id: str = ""
    ) -> pb.CheckPermissionResponse:
        """Decides whether the session may do `action` on `resource`, recording the
        decision in its log."""
        request = pb.CheckPermissionRequest(
            agent=agent, session_id=session_id, action=action, resource=resource
        )
        return self._call(self._stub.CheckPermission, request, request_id=request_id)


__all__ = [
    "RETRYABLE_METHODS",
    "SERVICE_CONFIG",
    "EventStream",
    "SessionClient",
    "SwitchboardError",
]


def _rewind_request(to: int | str, empty_log: bool) -> pb.RewindRequest:
    if isinstance(to, bool):
        raise TypeError("rewind takes a sequence (int) or a checkpoint label (str)")
    if isinstance(to, str):
        return pb.RewindRequest(checkpoint=to, empty_log=empty_log)
    return pb.RewindRequest(sequence=to, empty_log=empty_log)
