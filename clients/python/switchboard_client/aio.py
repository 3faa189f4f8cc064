"""asyncio clients for the two services, on grpc.aio channels.

`AsyncSessionClient` and `AsyncDeliveryClient` are what an asyncio gateway
(python-telegram-bot, slack_sdk's async client, discord.py) awaits. They share
the call discipline of the blocking clients (`switchboard_client._base`): the
same service configs, per-attempt deadlines, request ids kept across retries,
bearer token and `SwitchboardError`s. Method names, arguments and answers are
those of `SessionClient` and `DeliveryClient`; lists are async iterators.
They cover what a gateway and an agent framework's adapter need; operator calls
stay on the blocking clients.

Create them inside the running event loop and use them from that loop only.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from switchboard_client import _framework
from switchboard_client._base import MUTATION_ATTEMPTS, AsyncBaseClient
from switchboard_client._base import duration as _duration
from switchboard_client.delivery import SERVICE_CONFIG as DELIVERY_SERVICE_CONFIG
from switchboard_client.session import SERVICE_CONFIG as SESSION_SERVICE_CONFIG

log = logging.getLogger("switchboard_client")


class AsyncSessionClient(AsyncBaseClient):
    """The SessionService, awaited: `SessionClient`'s gateway methods."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        super().__init__(
            target,
            config=SESSION_SERVICE_CONFIG,
            timeout_s=timeout_s,
            channel=channel,
            token=token,
            mutation_attempts=mutation_attempts,
        )
        self._stub = pb_grpc.SessionServiceStub(self._channel)

    async def create_agent(self, name: str, *, request_id: str = "", **fields: Any) -> pb.Agent:
        request = pb.CreateAgentRequest(agent=pb.Agent(name=name, **fields))
        return (await self._call(self._stub.CreateAgent, request, request_id=request_id)).agent

    async def get_agent(self, name: str) -> pb.Agent:
        """Reads an agent, memory included."""
        return (await self._call(self._stub.GetAgent, pb.GetAgentRequest(name=name))).agent

    async def resolve(
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
        """The session a message from this source belongs to, created on first contact
        (as `SessionClient.resolve`: `lookup_only` never creates)."""
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
        return await self._call(self._stub.ResolveSession, request, request_id=request_id)

    async def get_session(self, agent: str, session_id: str) -> pb.Session:
        request = pb.GetSessionRequest(agent=agent, session_id=session_id)
        return (await self._call(self._stub.GetSession, request)).session

    async def get_session_with_state(self, agent: str, session_id: str) -> pb.GetSessionResponse:
        """A session and the scoped state it sees (as `SessionClient`'s)."""
        request = pb.GetSessionRequest(agent=agent, session_id=session_id, include_state=True)
        return await self._call(self._stub.GetSession, request)

    async def spawn(
        self,
        agent: str,
        session_id: str = "",
        *,
        temp_state: Mapping[str, str] | None = None,
        request_id: str = "",
        reopen_erased: bool = False,
    ) -> pb.Session:
        """Creates a session without a routing key (as `SessionClient.spawn`)."""
        request = pb.SpawnSessionRequest(
            agent=agent,
            session_id=session_id,
            temp_state=temp_state or {},
            reopen_erased=reopen_erased,
        )
        return (await self._call(self._stub.SpawnSession, request, request_id=request_id)).session

    async def iter_sessions(
        self,
        agent: str,
        *,
        status: pb.SessionStatus.ValueType = pb.SESSION_STATUS_UNSPECIFIED,
        transport: str = "",
        page_size: int = 0,
        user_id: str = "",
    ) -> AsyncIterator[pb.Session]:
        """The agent's sessions, newest first, as `SessionClient.list_sessions` yields
        them (an async iterator)."""
        request = pb.ListSessionsRequest(
            agent=agent, status=status, transport=transport, page_size=page_size, user_id=user_id
        )
        async for page in self._pages(self._stub.ListSessions, request):
            for session in page.sessions:
                yield session

    async def reset(
        self, agent: str, session_id: str, reason: str = "", *, request_id: str = ""
    ) -> pb.ResetSessionResponse:
        """The explicit reset ("/new"): ends the session, its routing key gets a fresh one."""
        request = pb.ResetSessionRequest(agent=agent, session_id=session_id, reason=reason)
        return await self._call(self._stub.ResetSession, request, request_id=request_id)

    async def mark_resumable(
        self,
        agent: str,
        session_id: str,
        pending: bool = True,
        *,
        holder: str = "",
        reply_target: bytes = b"",
        request_id: str = "",
    ) -> pb.Session:
        request = pb.MarkResumableRequest(
            agent=agent,
            session_id=session_id,
            pending=pending,
            holder=holder,
            reply_target=reply_target,
        )
        return (await self._call(self._stub.MarkResumable, request, request_id=request_id)).session

    async def list_resumable(self, agent: str) -> pb.ListResumableResponse:
        return await self._call(self._stub.ListResumable, pb.ListResumableRequest(agent=agent))

    async def expire_resumable(self, agent: str, *, request_id: str = "") -> list[pb.Session]:
        request = pb.ExpireResumableRequest(agent=agent)
        answer = await self._call(self._stub.ExpireResumable, request, request_id=request_id)
        return list(answer.expired)

    async def append(
        self,
        agent: str,
        session_id: str,
        *events: pb.SessionEventInput,
        expected_version: int | None = None,
        request_id: str = "",
        sequences_only: bool = False,
        state_deltas: Sequence[pb.StateDelta] = (),
    ) -> pb.AppendEventsResponse:
        request = pb.AppendEventsRequest(
            agent=agent,
            session_id=session_id,
            events=events,
            sequences_only=sequences_only,
            state_deltas=state_deltas,
        )
        if expected_version is not None:
            request.expected_version = expected_version
        return await self._call(self._stub.AppendEvents, request, request_id=request_id)

    async def post_to_inbox(
        self, agent: str, session_id: str, message: pb.Message, *, request_id: str = ""
    ) -> pb.Event:
        request = pb.PostToInboxRequest(agent=agent, session_id=session_id, message=message)
        return (await self._call(self._stub.PostToInbox, request, request_id=request_id)).event

    async def post_message(
        self,
        agent: str,
        session_id: str,
        message: pb.Message,
        *,
        mark_holder: str | None = None,
        reply_target: bytes = b"",
        request_id: str = "",
    ) -> pb.PostToInboxResponse:
        """`post_to_inbox`'s whole answer, `duplicate` included; `mark_holder` sets the
        resume mark, with `reply_target` sealed on it, in the same transaction (as
        `SessionClient.post_message`)."""
        request = pb.PostToInboxRequest(
            agent=agent,
            session_id=session_id,
            message=message,
            mark_resumable=mark_holder is not None,
            resume_holder=mark_holder or "",
            reply_target=reply_target,
        )
        return await self._call(self._stub.PostToInbox, request, request_id=request_id)

    async def history(
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
        """One window of the history, oldest first (as `SessionClient.history`)."""
        request = pb.GetHistoryRequest(
            agent=agent,
            session_id=session_id,
            after_sequence=after,
            limit=limit,
            newest=newest,
            include_abandoned=include_abandoned,
            before_sequence=before,
        )
        return list((await self._call(self._stub.GetHistory, request)).messages)

    async def state(self, agent: str, session_id: str) -> pb.GetSessionStateResponse:
        request = pb.GetSessionStateRequest(agent=agent, session_id=session_id)
        return await self._call(self._stub.GetSessionState, request)

    async def end(
        self, agent: str, session_id: str, reason: str = "", *, request_id: str = ""
    ) -> pb.Session:
        """Ends a session; its routing key no longer resolves to it."""
        request = pb.EndSessionRequest(agent=agent, session_id=session_id, reason=reason)
        return (await self._call(self._stub.EndSession, request, request_id=request_id)).session

    # -- what agent frameworks store (as `SessionClient`'s methods of the same names) ---

    async def retract_messages(
        self,
        agent: str,
        session_id: str,
        *,
        newest_count: int = 0,
        sequences: Sequence[int] = (),
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.RetractMessagesResponse:
        request = _framework.retract_request(
            agent, session_id, newest_count, sequences, expected_version
        )
        return await self._call(self._stub.RetractMessages, request, request_id=request_id)

    async def update_state(
        self,
        agent: str,
        deltas: Sequence[pb.StateDelta],
        *,
        session_id: str = "",
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.UpdateStateResponse:
        request = _framework.update_state_request(agent, deltas, session_id, expected_version)
        return await self._call(self._stub.UpdateState, request, request_id=request_id)

    async def user_state(self, agent: str, user_id: str) -> pb.GetUserStateResponse:
        request = pb.GetUserStateRequest(agent=agent, user_id=user_id)
        return await self._call(self._stub.GetUserState, request)

    async def put_records(
        self,
        agent: str,
        session_id: str,
        records: Sequence[pb.StoredRecord],
        *,
        versioned: bool = False,
        expected_version: int | None = None,
        request_id: str = "",
    ) -> pb.PutRecordsResponse:
        request = _framework.put_records_request(
            agent, session_id, records, versioned, expected_version
        )
        return await self._call(self._stub.PutRecords, request, request_id=request_id)

    async def get_record(
        self,
        agent: str,
        session_id: str,
        kind: str,
        *,
        namespace: str = "",
        key: str = "",
        children_kind: str = "",
    ) -> pb.GetRecordResponse:
        request = pb.GetRecordRequest(
            agent=agent,
            session_id=session_id,
            kind=kind,
            namespace=namespace,
            key=key,
            children_kind=children_kind,
        )
        return await self._call(self._stub.GetRecord, request)

    async def list_records(
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
    ) -> AsyncIterator[pb.StoredRecord]:
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
        async for page in self._pages(self._stub.ListRecords, request):
            for record in page.records:
                yield record

    async def erase_session(
        self, agent: str, session_id: str, *, request_id: str = ""
    ) -> pb.EraseSessionResponse:
        request = pb.EraseSessionRequest(agent=agent, session_id=session_id)
        return await self._call(self._stub.EraseSession, request, request_id=request_id)

    async def erase_records(
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
        return await self._call(self._stub.EraseRecords, request, request_id=request_id)


class AsyncDeliveryClient(AsyncBaseClient):
    """The DeliveryService, awaited: `DeliveryClient`'s gateway methods."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        best_effort_timeout_s: float = 2.0,
        channel: grpc.aio.Channel | None = None,
        token: str | None = None,
        mutation_attempts: int = MUTATION_ATTEMPTS,
    ) -> None:
        super().__init__(
            target,
            config=DELIVERY_SERVICE_CONFIG,
            timeout_s=timeout_s,
            channel=channel,
            token=token,
            mutation_attempts=mutation_attempts,
        )
        self.best_effort_timeout_s = best_effort_timeout_s
        self._stub = dpb_grpc.DeliveryServiceStub(self._channel)

    async def register(
        self,
        gateway_name: str,
        platforms: Sequence[str],
        *,
        host: str | None = None,
        pid: int | None = None,
        lease_ttl_s: float | None = None,
        request_id: str = "",
    ) -> dpb.Instance:
        """Registers this process start; call once per process."""
        request = dpb.RegisterInstanceRequest(
            gateway_name=gateway_name,
            host=socket.gethostname() if host is None else host,
            pid=os.getpid() if pid is None else pid,
            platforms=platforms,
        )
        if lease_ttl_s is not None:
            request.lease_ttl.CopyFrom(_duration(lease_ttl_s))
        answer = await self._call(self._stub.RegisterInstance, request, request_id=request_id)
        return answer.instance

    async def heartbeat(
        self, instance_id: str, platforms: Sequence[str], *, request_id: str = ""
    ) -> dpb.Instance:
        request = dpb.HeartbeatRequest(instance_id=instance_id, platforms=platforms)
        return (await self._call(self._stub.Heartbeat, request, request_id=request_id)).instance

    async def deregister(self, instance_id: str, *, request_id: str = "") -> dpb.Instance:
        request = dpb.DeregisterInstanceRequest(instance_id=instance_id)
        answer = await self._call(self._stub.DeregisterInstance, request, request_id=request_id)
        return answer.instance

    async def instance(self, instance_id: str) -> dpb.Instance:
        request = dpb.GetInstanceRequest(instance_id=instance_id)
        return (await self._call(self._stub.GetInstance, request)).instance

    async def record(
        self,
        instance_id: str,
        *,
        session_key: str,
        content: str,
        platform: str,
        chat_id: str,
        message_ref: str = "",
        thread_id: str = "",
        metadata: Mapping[str, str] | None = None,
        begin_attempt: bool = False,
        timeout_s: float | None = None,
        request_id: str = "",
        attempts: int | None = None,
        sealed_target: bytes = b"",
    ) -> dpb.RecordObligationResponse:
        """As `DeliveryClient.record`: decide from the returned row, not `created`."""
        request = dpb.RecordObligationRequest(
            instance_id=instance_id,
            session_key=session_key,
            message_ref=message_ref,
            content=content,
            platform=platform,
            chat_id=chat_id,
            thread_id=thread_id,
            metadata=metadata or {},
            begin_attempt=begin_attempt,
            sealed_target=sealed_target,
        )
        return await self._call(
            self._stub.RecordObligation,
            request,
            timeout_s,
            request_id=request_id,
            attempts=attempts,
        )

    async def record_best_effort(
        self,
        instance_id: str,
        *,
        session_key: str,
        content: str,
        platform: str,
        **fields: Any,
    ) -> dpb.RecordObligationResponse | None:
        """As `DeliveryClient.record_best_effort`: never raises; None means unrecorded."""
        try:
            return await self.record(
                instance_id,
                session_key=session_key,
                content=content,
                platform=platform,
                timeout_s=self.best_effort_timeout_s,
                attempts=1,
                **fields,
            )
        except Exception as exc:
            # Content is left out of the log on purpose: it is the user's message.
            log.warning(
                "delivery ledger: reply not recorded, sending it unrecorded "
                "(session_key=%r, platform=%r): %s",
                session_key,
                platform,
                exc,
            )
            return None

    async def mark_attempting(
        self, instance_id: str, obligation: dpb.Obligation, *, request_id: str = ""
    ) -> dpb.Obligation:
        request = dpb.MarkAttemptingRequest(
            obligation_id=obligation.id, instance_id=instance_id, fence=obligation.fence
        )
        answer = await self._call(self._stub.MarkAttempting, request, request_id=request_id)
        return answer.obligation

    async def mark_delivered(
        self,
        instance_id: str,
        obligation: dpb.Obligation,
        platform_message_id: str = "",
        *,
        request_id: str = "",
    ) -> dpb.Obligation:
        request = dpb.MarkDeliveredRequest(
            obligation_id=obligation.id,
            instance_id=instance_id,
            fence=obligation.fence,
            platform_message_id=platform_message_id,
        )
        answer = await self._call(self._stub.MarkDelivered, request, request_id=request_id)
        return answer.obligation

    async def mark_failed(
        self,
        instance_id: str,
        obligation: dpb.Obligation,
        error: str,
        *,
        retryable: bool,
        retry_after_s: float | None = None,
        request_id: str = "",
    ) -> dpb.Obligation:
        request = dpb.MarkFailedRequest(
            obligation_id=obligation.id,
            instance_id=instance_id,
            fence=obligation.fence,
            error=error,
            retryable=retryable,
        )
        if retry_after_s is not None:
            request.retry_after.CopyFrom(_duration(retry_after_s))
        answer = await self._call(self._stub.MarkFailed, request, request_id=request_id)
        return answer.obligation

    async def claim_recoverable(
        self,
        instance_id: str,
        *,
        deliverable_platforms: Sequence[str] | None = None,
        limit: int = 0,
        request_id: str = "",
    ) -> dpb.ClaimRecoverableResponse:
        """As `DeliveryClient.claim_recoverable` (None: the latest heartbeat's platforms)."""
        request = dpb.ClaimRecoverableRequest(instance_id=instance_id, limit=limit)
        if deliverable_platforms is not None:
            # SetInParent: an empty set must still be sent as a present (empty) message.
            request.deliverable_platforms.SetInParent()
            request.deliverable_platforms.platforms.extend(deliverable_platforms)
        return await self._call(self._stub.ClaimRecoverable, request, request_id=request_id)

    async def get(self, obligation_id: str) -> dpb.Obligation:
        request = dpb.GetObligationRequest(obligation_id=obligation_id)
        return (await self._call(self._stub.GetObligation, request)).obligation

    async def list(
        self,
        *,
        state: dpb.ObligationState.ValueType = dpb.OBLIGATION_STATE_UNSPECIFIED,
        platform: str = "",
        session_key: str = "",
        owner_instance_id: str = "",
        gateway_name: str = "",
        page_size: int = 0,
    ) -> AsyncIterator[dpb.Obligation]:
        """Every matching row, oldest first, fetching pages as iteration goes."""
        request = dpb.ListObligationsRequest(
            state=state,
            platform=platform,
            session_key=session_key,
            owner_instance_id=owner_instance_id,
            gateway_name=gateway_name,
            page_size=page_size,
        )
        async for page in self._pages(self._stub.ListObligations, request):
            for row in page.obligations:
                yield row


__all__ = ["AsyncDeliveryClient", "AsyncSessionClient"]
