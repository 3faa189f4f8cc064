"""Every request of the SessionService, built once for the blocking and the asyncio
clients (`SessionClient`, `AsyncSessionClient`): each function takes a client
method's arguments and describes its call (`switchboard_client._calls`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from google.protobuf import field_mask_pb2

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client._calls import Call, Pages
from switchboard_client._framework import Labels, label_filters

# -- agents ---------------------------------------------------------------------------


def create_agent(name: str, *, request_id: str = "", **fields: Any) -> Call[pb.Agent]:
    """Creates an agent; `fields` are other `Agent` fields (display_name, permissions,
    peers, settings, memory, parent, ...)."""
    request = pb.CreateAgentRequest(agent=pb.Agent(name=name, **fields))
    return Call("CreateAgent", request, attrgetter("agent"), request_id=request_id)


def get_agent(name: str) -> Call[pb.Agent]:
    """Reads an agent, memory included."""
    return Call("GetAgent", pb.GetAgentRequest(name=name), attrgetter("agent"))


def list_agents(*, include_archived: bool = False, page_size: int = 0) -> Pages[pb.Agent]:
    """Every agent by name (memory omitted), fetching pages lazily as iteration goes."""
    request = pb.ListAgentsRequest(include_archived=include_archived, page_size=page_size)
    return Pages("ListAgents", request, attrgetter("agents"))


def update_agent(agent: pb.Agent, paths: Sequence[str], *, request_id: str = "") -> Call[pb.Agent]:
    """Changes the fields of `agent` named by `paths` (e.g. "display_name",
    "settings.routing"); `agent.name` selects the agent."""
    request = pb.UpdateAgentRequest(agent=agent, update_mask=field_mask_pb2.FieldMask(paths=paths))
    return Call("UpdateAgent", request, attrgetter("agent"), request_id=request_id)


def delete_agent(name: str) -> Call[pb.Agent]:
    """Archives an agent (kept in the log, no longer routable); repeating is harmless."""
    return Call("DeleteAgent", pb.DeleteAgentRequest(name=name), attrgetter("agent"))


def put_memory(agent: str, key: str, value: str, *, request_id: str = "") -> Call[pb.Agent]:
    """Sets one memory entry of an agent (shared by all its sessions)."""
    request = pb.PutMemoryRequest(agent=agent, key=key, value=value)
    return Call("PutMemory", request, attrgetter("agent"), request_id=request_id)


def delete_memory(agent: str, key: str, *, request_id: str = "") -> Call[pb.Agent]:
    """Removes one memory entry of an agent."""
    request = pb.DeleteMemoryRequest(agent=agent, key=key)
    return Call("DeleteMemory", request, attrgetter("agent"), request_id=request_id)


# -- sessions -------------------------------------------------------------------------


def resolve(
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
) -> Call[pb.ResolveSessionResponse]:
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
    return Call("ResolveSession", request, request_id=request_id)


def join(agent: str, session_id: str) -> Call[pb.Session]:
    """An existing open session of the agent (NOT_FOUND otherwise); creates nothing."""
    request = pb.ResolveSessionRequest(agent=agent, session_id=session_id)
    return Call("ResolveSession", request, attrgetter("session"))


def spawn(
    agent: str,
    session_id: str = "",
    *,
    temp_state: Mapping[str, str] | None = None,
    request_id: str = "",
    reopen_erased: bool = False,
) -> Call[pb.Session]:
    """Creates a session without a routing key; `session_id` "" generates one.
    `reopen_erased`: take an id whose session was erased."""
    request = pb.SpawnSessionRequest(
        agent=agent,
        session_id=session_id,
        temp_state=temp_state or {},
        reopen_erased=reopen_erased,
    )
    return Call("SpawnSession", request, attrgetter("session"), request_id=request_id)


def get_session(agent: str, session_id: str) -> Call[pb.Session]:
    """Reads a session's summary."""
    request = pb.GetSessionRequest(agent=agent, session_id=session_id)
    return Call("GetSession", request, attrgetter("session"))


def get_session_with_state(agent: str, session_id: str) -> Call[pb.GetSessionResponse]:
    """A session's summary and the scoped state it sees (`scoped_state`: its own, its
    user's, its agent's; values are JSON text, `state_values` decodes them)."""
    request = pb.GetSessionRequest(agent=agent, session_id=session_id, include_state=True)
    return Call("GetSession", request)


def list_sessions(
    agent: str,
    *,
    status: pb.SessionStatus.ValueType = pb.SESSION_STATUS_UNSPECIFIED,
    transport: str = "",
    page_size: int = 0,
    user_id: str = "",
) -> Pages[pb.Session]:
    """The agent's sessions, newest first, fetching pages lazily as iteration goes;
    `user_id`: only that user's (Source.user_id)."""
    request = pb.ListSessionsRequest(
        agent=agent, status=status, transport=transport, page_size=page_size, user_id=user_id
    )
    return Pages("ListSessions", request, attrgetter("sessions"))


def end(agent: str, session_id: str, reason: str = "", *, request_id: str = "") -> Call[pb.Session]:
    """Ends a session; its routing key no longer resolves to it. Repeating is harmless."""
    request = pb.EndSessionRequest(agent=agent, session_id=session_id, reason=reason)
    return Call("EndSession", request, attrgetter("session"), request_id=request_id)


def reset(
    agent: str, session_id: str, reason: str = "", *, request_id: str = ""
) -> Call[pb.ResetSessionResponse]:
    """The explicit reset ("/new"): ends the session, its routing key gets a fresh one."""
    request = pb.ResetSessionRequest(agent=agent, session_id=session_id, reason=reason)
    return Call("ResetSession", request, request_id=request_id)


def mark_resumable(
    agent: str,
    session_id: str,
    pending: bool = True,
    *,
    holder: str = "",
    reply_target: bytes = b"",
    request_id: str = "",
) -> Call[pb.Session]:
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
    return Call("MarkResumable", request, attrgetter("session"), request_id=request_id)


def suspend(
    agent: str, session_id: str, suspended: bool = True, *, request_id: str = ""
) -> Call[pb.Session]:
    """Suspends the session (never auto-resumed), or lifts the suspension with False."""
    request = pb.SuspendSessionRequest(agent=agent, session_id=session_id, suspended=suspended)
    return Call("SuspendSession", request, attrgetter("session"), request_id=request_id)


def list_resumable(agent: str) -> Call[pb.ListResumableResponse]:
    """Interrupted sessions fresh enough to resume (`sessions`), and the stale ones
    (`stale`, not to be continued). A read: `expire_resumable` resets the stale."""
    request = pb.ListResumableRequest(agent=agent)
    return Call("ListResumable", request)


def expire_resumable(agent: str, *, request_id: str = "") -> Call[list[pb.Session]]:
    """Resets the agent's stale interrupted sessions; returns them, ended."""
    request = pb.ExpireResumableRequest(agent=agent)
    return Call("ExpireResumable", request, _expired, request_id=request_id)


# -- the conversation -----------------------------------------------------------------


def append(
    agent: str,
    session_id: str,
    *events: pb.SessionEventInput,
    expected_version: int | None = None,
    request_id: str = "",
    sequences_only: bool = False,
    state_deltas: Sequence[pb.StateDelta] = (),
) -> Call[pb.AppendEventsResponse]:
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
    return Call("AppendEvents", request, request_id=request_id)


def append_message(
    agent: str,
    session_id: str,
    role: pb.Role.ValueType,
    content: str,
    *,
    expected_version: int | None = None,
    **message_fields: Any,
) -> Call[pb.AppendEventsResponse]:
    """Appends one history message; `message_fields` are other `Message` fields."""
    event = pb.SessionEventInput(
        message_appended=pb.MessageAppended(
            message=pb.Message(role=role, content=content, **message_fields)
        )
    )
    return append(agent, session_id, event, expected_version=expected_version)


def post_to_inbox(
    agent: str, session_id: str, message: pb.Message, *, request_id: str = ""
) -> Call[pb.Event]:
    """Puts a message into the session's inbox; never conflicts with a running turn."""
    request = pb.PostToInboxRequest(agent=agent, session_id=session_id, message=message)
    return Call("PostToInbox", request, attrgetter("event"), request_id=request_id)


def post_message(
    agent: str,
    session_id: str,
    message: pb.Message,
    *,
    mark_holder: str | None = None,
    reply_target: bytes = b"",
    request_id: str = "",
) -> Call[pb.PostToInboxResponse]:
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
    return Call("PostToInbox", request, request_id=request_id)


def history(
    agent: str,
    session_id: str,
    *,
    after: int = 0,
    limit: int = 0,
    newest: bool = False,
    include_abandoned: bool = False,
    before: int = 0,
) -> Call[list[pb.QueuedMessage]]:
    """A window of the history, oldest first: the oldest `limit` messages after
    sequence `after` (and before `before`, 0: none), or with `newest` the newest
    `limit` (0: server default). One page: `history_pages` follows the tokens."""
    page = history_page(
        agent,
        session_id,
        after=after,
        limit=limit,
        newest=newest,
        include_abandoned=include_abandoned,
        before=before,
    )
    return Call(page.method, page.request, _messages)


def history_page(
    agent: str,
    session_id: str,
    *,
    after: int = 0,
    limit: int = 0,
    newest: bool = False,
    include_abandoned: bool = False,
    before: int = 0,
    page_token: str = "",
) -> Call[pb.GetHistoryResponse]:
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
    return Call("GetHistory", request)


def history_pages(
    agent: str, session_id: str, *, newest: bool = False, limit: int = 0
) -> Pages[pb.GetHistoryResponse]:
    """Every page of the history, fetched lazily: oldest first, or with `newest`
    from the newest page backwards (each page's messages still oldest first)."""
    request = pb.GetHistoryRequest(agent=agent, session_id=session_id, newest=newest, limit=limit)
    return Pages("GetHistory", request, _itself)


def state(agent: str, session_id: str) -> Call[pb.GetSessionStateResponse]:
    """The session's state (summary, inbox, outbox, task, temp state) and its agent."""
    request = pb.GetSessionStateRequest(agent=agent, session_id=session_id)
    return Call("GetSessionState", request)


def snapshot(agent: str, session_id: str, *, request_id: str = "") -> Call[int]:
    """Writes snapshots of the session and its agent now; returns the sequence."""
    request = pb.SnapshotSessionRequest(agent=agent, session_id=session_id)
    return Call("SnapshotSession", request, attrgetter("sequence"), request_id=request_id)


# -- what agent frameworks store ------------------------------------------------------


def retract_messages(
    agent: str,
    session_id: str,
    *,
    newest_count: int = 0,
    sequences: Sequence[int] = (),
    expected_version: int | None = None,
    request_id: str = "",
) -> Call[pb.RetractMessagesResponse]:
    """Takes the newest `newest_count` messages (or those at `sequences`) out of the
    history in one logged, versioned change; answers them (none: nothing was there,
    nothing written). A rewind past it brings them back."""
    request = pb.RetractMessagesRequest(
        agent=agent, session_id=session_id, newest_count=newest_count, sequences=sequences
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return Call("RetractMessages", request, request_id=request_id)


def update_state(
    agent: str,
    deltas: Sequence[pb.StateDelta],
    *,
    session_id: str = "",
    expected_version: int | None = None,
    request_id: str = "",
) -> Call[pb.UpdateStateResponse]:
    """Applies scoped state changes (`state_delta(...)`) atomically, without events;
    SESSION-scoped ones need `session_id`."""
    request = pb.UpdateStateRequest(agent=agent, session_id=session_id, deltas=deltas)
    if expected_version is not None:
        request.expected_version = expected_version
    return Call("UpdateState", request, request_id=request_id)


def user_state(agent: str, user_id: str) -> Call[pb.GetUserStateResponse]:
    """The state the agent keeps for one user (JSON text values: `state_values`)."""
    request = pb.GetUserStateRequest(agent=agent, user_id=user_id)
    return Call("GetUserState", request)


def put_records(
    agent: str,
    session_id: str,
    records: Sequence[pb.StoredRecord],
    *,
    versioned: bool = False,
    expected_version: int | None = None,
    request_id: str = "",
) -> Call[pb.PutRecordsResponse]:
    """Stores records in one logged event; unversioned unless `versioned`."""
    request = pb.PutRecordsRequest(
        agent=agent, session_id=session_id, records=records, versioned=versioned
    )
    if expected_version is not None:
        request.expected_version = expected_version
    return Call("PutRecords", request, request_id=request_id)


def get_record(
    agent: str,
    session_id: str,
    kind: str,
    *,
    namespace: str = "",
    key: str = "",
    children_kind: str = "",
) -> Call[pb.GetRecordResponse]:
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
    return Call("GetRecord", request)


def list_records(
    agent: str,
    kind: str,
    *,
    session_id: str = "",
    namespace: str | None = None,
    keys: Sequence[str] = (),
    parent_key: str | None = None,
    before_key: str = "",
    labels: Labels | None = None,
    metadata_filter: Mapping[str, Any] | None = None,
    include_payloads: bool = False,
    page_size: int = 0,
) -> Pages[pb.StoredRecord]:
    """Records of a kind, newest put first, in a session (or every session of the
    agent), fetching pages lazily; `labels` maps a label to its accepted values,
    `metadata_filter` a metadata key to the value it must have (compared as JSON)."""
    request = pb.ListRecordsRequest(
        agent=agent,
        session_id=session_id,
        kind=kind,
        keys=keys,
        before_key=before_key,
        labels=label_filters(labels),
        metadata_filter={k: json.dumps(v) for k, v in (metadata_filter or {}).items()},
        include_payloads=include_payloads,
        page_size=page_size,
    )
    if namespace is not None:
        request.namespace = namespace
    if parent_key is not None:
        request.parent_key = parent_key
    return Pages("ListRecords", request, attrgetter("records"))


def erase_session(
    agent: str, session_id: str, *, request_id: str = ""
) -> Call[pb.EraseSessionResponse]:
    """Erases a session for good: its content leaves the log (tombstones keep the
    sequence), snapshots, projections and remembered answers; no rewind or
    checkout brings it back."""
    request = pb.EraseSessionRequest(agent=agent, session_id=session_id)
    return Call("EraseSession", request, request_id=request_id)


def erase_records(
    agent: str,
    kind: str,
    *,
    session_id: str = "",
    namespace: str | None = None,
    keys: Sequence[str] = (),
    labels: Labels | None = None,
    all_records: bool = False,
    keep_newest_per_namespace: int | None = None,
    children_kind: str = "",
    request_id: str = "",
) -> Call[pb.EraseRecordsResponse]:
    """Erases records of a kind (exactly one of `keys`, `labels`, `all_records`,
    `keep_newest_per_namespace`), with their children of `children_kind`."""
    request = pb.EraseRecordsRequest(
        agent=agent,
        session_id=session_id,
        kind=kind,
        keys=keys,
        labels=label_filters(labels),
        all=all_records,
        children_kind=children_kind,
    )
    if namespace is not None:
        request.namespace = namespace
    if keep_newest_per_namespace is not None:
        request.keep_newest_per_namespace = keep_newest_per_namespace
    return Call("EraseRecords", request, request_id=request_id)


# -- time travel ----------------------------------------------------------------------


def create_checkpoint(label: str, *, request_id: str = "") -> Call[pb.Checkpoint]:
    """Names the current head of the log (ALREADY_EXISTS for a taken label)."""
    request = pb.CreateCheckpointRequest(label=label)
    return Call("CreateCheckpoint", request, attrgetter("checkpoint"), request_id=request_id)


def list_checkpoints(*, page_size: int = 0) -> Pages[pb.Checkpoint]:
    """All checkpoints, oldest first (fetched page by page)."""
    request = pb.ListCheckpointsRequest(page_size=page_size)
    return Pages("ListCheckpoints", request, attrgetter("checkpoints"))


def list_log_events(
    *,
    after: int = 0,
    before: int = 0,
    agent: str = "",
    session_id: str = "",
    event_types: Sequence[str] = (),
    branch: pb.LogBranch.ValueType = pb.LOG_BRANCH_UNSPECIFIED,
    page_size: int = 0,
) -> Pages[pb.LogEntry]:
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
    return Pages("ListLogEvents", request, attrgetter("entries"))


def rewind(to: int | str, *, empty_log: bool = False, request_id: str = "") -> Call[pb.Event]:
    """Moves every agent and session back to a sequence (int) or checkpoint (label).

    Returns the rewind record; everything after the target is abandoned. With
    nothing to abandon nothing is written and the record is empty (sequence 0):
    `preview_rewind` tells in advance. Sequence 0 is the empty log, every agent
    and session abandoned: the server goes there only with `empty_log=True`.
    """
    request = _rewind_request(to, empty_log)
    return Call("Rewind", request, attrgetter("record"), request_id=request_id)


def preview_rewind(to: int | str, *, empty_log: bool = False) -> Call[pb.RewindResponse]:
    """What `rewind(to)` would abandon, per agent and session; writes nothing."""
    request = _rewind_request(to, empty_log)
    request.preview = True
    return Call("Rewind", request)


def checkout(sequence: int, *, empty_log: bool = False, request_id: str = "") -> Call[pb.Event]:
    """Like `rewind`, to any retained sequence, abandoned branches included;
    sequence 0 (the empty log) only with `empty_log=True`."""
    request = pb.CheckoutRequest(sequence=sequence, empty_log=empty_log)
    return Call("Checkout", request, attrgetter("record"), request_id=request_id)


def preview_checkout(sequence: int, *, empty_log: bool = False) -> Call[pb.CheckoutResponse]:
    """What `checkout(sequence)` would abandon and restore; writes nothing."""
    request = pb.CheckoutRequest(sequence=sequence, preview=True, empty_log=empty_log)
    return Call("Checkout", request)


def truncate_log(below_sequence: int, *, request_id: str = "") -> Call[pb.TruncateLogResponse]:
    """Deletes log events below a sequence (at least 1) that snapshots made
    unnecessary."""
    request = pb.TruncateLogRequest(below_sequence=below_sequence)
    return Call("TruncateLog", request, request_id=request_id)


# -- multi-agent ----------------------------------------------------------------------


def fork(
    agent: str,
    session_id: str,
    *,
    at_sequence: int = 0,
    narrowing: Sequence[pb.PermissionRule] = (),
    request_id: str = "",
) -> Call[pb.Session]:
    """Branches a session (history and state at `at_sequence`, 0: now) under the same
    agent; `narrowing` rules restrict the fork further."""
    request = pb.ForkSessionRequest(
        agent=agent,
        session_id=session_id,
        at_sequence=at_sequence,
        narrowing=pb.Narrowing(rules=narrowing),
    )
    return Call("ForkSession", request, attrgetter("session"), request_id=request_id)


def delegate(
    agent: str,
    session_id: str,
    to_agent: str,
    task: pb.Message,
    *,
    context: str = "",
    request_id: str = "",
) -> Call[pb.DelegateResponse]:
    """Hands `task` to a peer agent's session for the peer conversation
    "<agent>:<context>" sent by `agent` (gated by "peer.delegate"); the same context
    resumes the same session. An empty task sender is stored as "agent:<agent>"."""
    request = pb.DelegateRequest(
        agent=agent, session_id=session_id, to_agent=to_agent, task=task, context=context
    )
    return Call("Delegate", request, request_id=request_id)


def send_to_peer(
    agent: str,
    session_id: str,
    to_agent: str,
    message: pb.Message,
    *,
    to_session_id: str = "",
    source: pb.Source | None = None,
    request_id: str = "",
) -> Call[pb.Event]:
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
    return Call("SendToPeer", request, attrgetter("event"), request_id=request_id)


def check_permission(
    agent: str, session_id: str, action: str, resource: str = "", *, request_id: str = ""
) -> Call[pb.CheckPermissionResponse]:
    """Decides whether the session may do `action` on `resource`, recording the
    decision in its log."""
    request = pb.CheckPermissionRequest(
        agent=agent, session_id=session_id, action=action, resource=resource
    )
    return Call("CheckPermission", request, request_id=request_id)


def _rewind_request(to: int | str, empty_log: bool) -> pb.RewindRequest:
    if isinstance(to, bool):
        raise TypeError("rewind takes a sequence (int) or a checkpoint label (str)")
    if isinstance(to, str):
        return pb.RewindRequest(checkpoint=to, empty_log=empty_log)
    return pb.RewindRequest(sequence=to, empty_log=empty_log)


def _expired(answer: pb.ExpireResumableResponse) -> list[pb.Session]:
    return list(answer.expired)


def _messages(answer: pb.GetHistoryResponse) -> list[pb.QueuedMessage]:
    return list(answer.messages)


def _itself(page: pb.GetHistoryResponse) -> Iterable[pb.GetHistoryResponse]:
    return (page,)
