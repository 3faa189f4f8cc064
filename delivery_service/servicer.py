"""The gRPC face of the ledger: converts messages, nothing more.

Errors raised by the ledger reach the client through
`switchboard.grpc_errors.DomainErrorInterceptor`.
"""

from __future__ import annotations

from typing import Any

from delivery_service.ledger import Ledger
from delivery_service.records import Instance, NewObligation, Obligation, ObligationFilter
from delivery_service.state_machine import State
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.errors import InvalidArgument
from switchboard.proto_time import duration, seconds_of, timestamp

Context = Any  # grpc.aio.ServicerContext; unused by these handlers

_STATE_TO_PB = {
    State.PENDING: pb.OBLIGATION_STATE_PENDING,
    State.ATTEMPTING: pb.OBLIGATION_STATE_ATTEMPTING,
    State.DELIVERED: pb.OBLIGATION_STATE_DELIVERED,
    State.FAILED: pb.OBLIGATION_STATE_FAILED,
    State.ABANDONED: pb.OBLIGATION_STATE_ABANDONED,
}
_STATE_FROM_PB = {value: state for state, value in _STATE_TO_PB.items()}


def instance_pb(instance: Instance, live: bool | None = None) -> pb.Instance:
    """An instance; `live` None means as a register or heartbeat just left it: live
    unless it deregistered."""
    return pb.Instance(
        instance_id=instance.id,
        gateway_name=instance.gateway_name,
        host=instance.host,
        pid=instance.pid,
        platforms=instance.platforms,
        register_time=timestamp(instance.registered_at),
        heartbeat_time=timestamp(instance.heartbeat_at),
        lease_expire_time=timestamp(instance.lease_expires_at),
        deregister_time=timestamp(instance.deregistered_at),
        live=instance.deregistered_at is None if live is None else live,
    )


def obligation_pb(row: Obligation) -> pb.Obligation:
    return pb.Obligation(
        id=row.id,
        session_key=row.session_key,
        message_ref=row.message_ref,
        content=row.content,
        platform=row.platform,
        chat_id=row.chat_id,
        thread_id=row.thread_id,
        metadata=row.metadata,
        state=_STATE_TO_PB[row.state],
        owner_instance_id=row.owner_instance_id or "",
        fence=row.fence,
        attempts=row.attempts,
        needs_marker=row.needs_marker,
        platform_message_id=row.platform_message_id,
        last_error=row.last_error,
        create_time=timestamp(row.created_at),
        update_time=timestamp(row.updated_at),
        next_attempt_time=timestamp(row.next_attempt_at),
        deliver_time=timestamp(row.delivered_at),
    )


def state_filter(value: int) -> State | None:
    if value == pb.OBLIGATION_STATE_UNSPECIFIED:
        return None
    if value not in _STATE_FROM_PB:
        raise InvalidArgument("state", f"{value} is not a known ObligationState")
    return _STATE_FROM_PB[value]  # type: ignore[index]


class DeliveryServicer(pb_grpc.DeliveryServiceServicer):
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    async def RegisterInstance(  # noqa: N802
        self, request: pb.RegisterInstanceRequest, context: Context
    ) -> pb.RegisterInstanceResponse:
        ttl = seconds_of(request.lease_ttl) if request.HasField("lease_ttl") else None
        instance = await self.ledger.register_instance(
            request.gateway_name, request.host, request.pid, request.platforms, ttl
        )
        return pb.RegisterInstanceResponse(instance=instance_pb(instance))

    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        instance = await self.ledger.heartbeat(request.instance_id, request.platforms)
        return pb.HeartbeatResponse(instance=instance_pb(instance))

    async def DeregisterInstance(  # noqa: N802
        self, request: pb.DeregisterInstanceRequest, context: Context
    ) -> pb.DeregisterInstanceResponse:
        instance = await self.ledger.deregister(request.instance_id)
        return pb.DeregisterInstanceResponse(instance=instance_pb(instance))

    async def GetInstance(  # noqa: N802
        self, request: pb.GetInstanceRequest, context: Context
    ) -> pb.GetInstanceResponse:
        instance, live = await self.ledger.get_instance(request.instance_id)
        return pb.GetInstanceResponse(instance=instance_pb(instance, live))

    async def RecordObligation(  # noqa: N802
        self, request: pb.RecordObligationRequest, context: Context
    ) -> pb.RecordObligationResponse:
        new = NewObligation(
            session_key=request.session_key,
            message_ref=request.message_ref,
            content=request.content,
            platform=request.platform,
            chat_id=request.chat_id,
            thread_id=request.thread_id,
            metadata=dict(request.metadata),
        )
        row, created = await self.ledger.record(request.instance_id, new, request.begin_attempt)
        return pb.RecordObligationResponse(obligation=obligation_pb(row), created=created)

    async def MarkAttempting(  # noqa: N802
        self, request: pb.MarkAttemptingRequest, context: Context
    ) -> pb.MarkAttemptingResponse:
        row = await self.ledger.mark_attempting(
            request.obligation_id, request.instance_id, request.fence
        )
        return pb.MarkAttemptingResponse(obligation=obligation_pb(row))

    async def MarkDelivered(  # noqa: N802
        self, request: pb.MarkDeliveredRequest, context: Context
    ) -> pb.MarkDeliveredResponse:
        row = await self.ledger.mark_delivered(
            request.obligation_id, request.instance_id, request.fence, request.platform_message_id
        )
        return pb.MarkDeliveredResponse(obligation=obligation_pb(row))

    async def MarkFailed(  # noqa: N802
        self, request: pb.MarkFailedRequest, context: Context
    ) -> pb.MarkFailedResponse:
        retry_after = seconds_of(request.retry_after) if request.HasField("retry_after") else None
        row = await self.ledger.mark_failed(
            request.obligation_id,
            request.instance_id,
            request.fence,
            request.error,
            request.retryable,
            retry_after,
        )
        return pb.MarkFailedResponse(obligation=obligation_pb(row))

    async def ClaimRecoverable(  # noqa: N802
        self, request: pb.ClaimRecoverableRequest, context: Context
    ) -> pb.ClaimRecoverableResponse:
        deliverable = (
            list(request.deliverable_platforms.platforms)
            if request.HasField("deliverable_platforms")
            else None
        )
        result = await self.ledger.claim_recoverable(
            request.instance_id, deliverable, request.limit
        )
        return pb.ClaimRecoverableResponse(
            obligations=[obligation_pb(row) for row in result.obligations],
            abandoned_count=result.abandoned_count,
            gated_count=result.gated_count,
        )

    async def GetObligation(  # noqa: N802
        self, request: pb.GetObligationRequest, context: Context
    ) -> pb.GetObligationResponse:
        row = await self.ledger.get(request.obligation_id)
        return pb.GetObligationResponse(obligation=obligation_pb(row))

    async def ListObligations(  # noqa: N802
        self, request: pb.ListObligationsRequest, context: Context
    ) -> pb.ListObligationsResponse:
        where = ObligationFilter(
            state=state_filter(request.state),
            platform=request.platform,
            session_key=request.session_key,
            owner_instance_id=request.owner_instance_id,
        )
        page = await self.ledger.list(where, request.page_size, request.page_token)
        return pb.ListObligationsResponse(
            obligations=[obligation_pb(row) for row in page.obligations],
            next_page_token=page.next_page_token,
        )

    async def RetryObligation(  # noqa: N802
        self, request: pb.RetryObligationRequest, context: Context
    ) -> pb.RetryObligationResponse:
        row = await self.ledger.retry(request.obligation_id)
        return pb.RetryObligationResponse(obligation=obligation_pb(row))

    async def AbandonObligation(  # noqa: N802
        self, request: pb.AbandonObligationRequest, context: Context
    ) -> pb.AbandonObligationResponse:
        row = await self.ledger.abandon(request.obligation_id, request.reason)
        return pb.AbandonObligationResponse(obligation=obligation_pb(row))

    async def GetLedgerStats(  # noqa: N802
        self, request: pb.GetLedgerStatsRequest, context: Context
    ) -> pb.GetLedgerStatsResponse:
        stats = await self.ledger.stats()
        return pb.GetLedgerStatsResponse(
            state_counts=[
                pb.StateCount(state=_STATE_TO_PB[state], count=count)
                for state, count in stats.state_counts.items()
            ],
            oldest_pending_age=duration(stats.oldest_pending_age_s),
            in_doubt_count=stats.in_doubt_count,
            gated=[
                pb.PlatformGate(platform=platform, count=count)
                for platform, count in sorted(stats.gated_by_platform.items())
            ],
            live_instance_count=stats.live_instance_count,
        )

    async def PruneObligations(  # noqa: N802
        self, request: pb.PruneObligationsRequest, context: Context
    ) -> pb.PruneObligationsResponse:
        older_than = seconds_of(request.older_than) if request.HasField("older_than") else None
        if older_than is not None and older_than < 0:
            raise InvalidArgument("older_than", "must not be negative")
        return pb.PruneObligationsResponse(pruned_count=await self.ledger.prune(older_than))
