"""A typed, synchronous client for the SessionService (agents, sessions, the event log).

A gateway resolves each incoming message to its session, appends the turn's
events, reads history and state to build the next prompt, and may watch the
log live. This client wraps the generated stub so that every unary call has a
deadline, transient outages of idempotent calls are retried by gRPC itself,
and every failure surfaces as one exception type, `SwitchboardError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, Self

import grpc

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_client import _session_calls as calls
from switchboard_client._base import BaseClient, blocking, blocking_pages, service_config
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

    def __exit__(self, *exc_info: object) -> None:
        self.cancel()


class SessionClient(BaseClient):
    """The SessionService for one gateway process (thread-safe, like its channel).

    Every method raises `SwitchboardError` on failure. Methods take and return the
    generated messages of `switchboard.session.v1.session_service_pb2`; each builds
    its request in `switchboard_client._session_calls`, where its docstring is.
    """

    SERVICE_CONFIG = SERVICE_CONFIG
    STUB = pb_grpc.SessionServiceStub
    _stub: pb_grpc.SessionServiceStub

    # -- agents ---------------------------------------------------------------------------
    create_agent = blocking(calls.create_agent)
    get_agent = blocking(calls.get_agent)
    list_agents = blocking_pages(calls.list_agents)
    update_agent = blocking(calls.update_agent)
    delete_agent = blocking(calls.delete_agent)
    put_memory = blocking(calls.put_memory)
    delete_memory = blocking(calls.delete_memory)

    # -- sessions -------------------------------------------------------------------------
    resolve = blocking(calls.resolve)
    join = blocking(calls.join)
    spawn = blocking(calls.spawn)
    get_session = blocking(calls.get_session)
    get_session_with_state = blocking(calls.get_session_with_state)
    list_sessions = blocking_pages(calls.list_sessions)
    end = blocking(calls.end)
    reset = blocking(calls.reset)
    mark_resumable = blocking(calls.mark_resumable)
    suspend = blocking(calls.suspend)
    list_resumable = blocking(calls.list_resumable)
    expire_resumable = blocking(calls.expire_resumable)

    # -- the conversation -----------------------------------------------------------------
    append = blocking(calls.append)
    append_message = blocking(calls.append_message)
    post_to_inbox = blocking(calls.post_to_inbox)
    post_message = blocking(calls.post_message)
    history = blocking(calls.history)
    history_page = blocking(calls.history_page)
    history_pages = blocking_pages(calls.history_pages)
    state = blocking(calls.state)
    snapshot = blocking(calls.snapshot)

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
    retract_messages = blocking(calls.retract_messages)
    update_state = blocking(calls.update_state)
    user_state = blocking(calls.user_state)
    put_records = blocking(calls.put_records)
    get_record = blocking(calls.get_record)
    list_records = blocking_pages(calls.list_records)
    erase_session = blocking(calls.erase_session)
    erase_records = blocking(calls.erase_records)

    # -- time travel ----------------------------------------------------------------------
    create_checkpoint = blocking(calls.create_checkpoint)

    def list_checkpoints(self, *, page_size: int = 0) -> list[pb.Checkpoint]:
        """All checkpoints, oldest first (fetched page by page)."""
        return list(self._iterate(calls.list_checkpoints(page_size=page_size)))

    list_log_events = blocking_pages(calls.list_log_events)
    rewind = blocking(calls.rewind)
    preview_rewind = blocking(calls.preview_rewind)
    checkout = blocking(calls.checkout)
    preview_checkout = blocking(calls.preview_checkout)
    truncate_log = blocking(calls.truncate_log)

    # -- multi-agent ----------------------------------------------------------------------
    fork = blocking(calls.fork)
    delegate = blocking(calls.delegate)
    send_to_peer = blocking(calls.send_to_peer)
    check_permission = blocking(calls.check_permission)


__all__ = [
    "RETRYABLE_METHODS",
    "SERVICE_CONFIG",
    "EventStream",
    "SessionClient",
    "SwitchboardError",
]
