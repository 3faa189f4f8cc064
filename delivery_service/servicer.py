"""The gRPC face of the ledger: converts messages, nothing more.

Errors raised by the ledger reach the client through
`switchboard.grpc_errors.DomainErrorInterceptor`. The caller's grant becomes a
plain `Caller` here; the ledger's rules decide what it may do.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from delivery_service.ledger import Ledger
from delivery_service.records import (
    Caller,
    ClaimResult,
    Instance,
    InstancePage,
    NewObligation,
    Obligation,
    ObligationFilter,
)
from delivery_service.state_machine import State
from switchboard import auth, validation
from switchboard.call_stream import CarriedCalls
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard.errors import InvalidArgument
from switchboard.idempotency import RequestGuard, RequestStore
from switchboard.mutations import Mutations
from switchboard.proto_time import duration, timestamp

Context = Any  # grpc.aio.ServicerContext; unused by these handlers
Answer = TypeVar("Answer", bound=Message)

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


def caller() -> Caller:
    """The call's grant as the ledger's rules take it: admin and authentication off
    are unrestricted, any other token acts for its agents."""
    grant = auth.current_grant()
    if grant is None:
        return Caller()
    if grant.admin:
        return Caller(principal=grant.principal)
    return Caller(principal=grant.principal, agents=grant.agents, gateway=grant.gateway)


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
        agent=row.agent,
        gateway_name=row.gateway_name,
        sealed_target=row.sealed_target,
    )


def seconds_given(request: Message, field: str) -> float | None:
    """A request's Duration field as seconds (None when unset), checked by
    `validation.duration`: normal form, never negative. The ledger checks each
    one's own range."""
    if not request.HasField(field):
        return None
    return validation.duration(field, getattr(request, field))


def state_filter(value: int) -> State | None:
    if value == pb.OBLIGATION_STATE_UNSPECIFIED:
        return None
    if value not in _STATE_FROM_PB:
        raise InvalidArgument("state", f"{value} is not a known ObligationState")
    return _STATE_FROM_PB[value]  # type: ignore[index]


def with_instance(response: type[Answer]) -> Callable[[Instance], Answer]:
    """The response of an RPC that answers with the instance it changed."""
    return lambda instance: response(instance=instance_pb(instance))


def with_obligation(response: type[Answer]) -> Callable[[Obligation], Answer]:
    """The response of an RPC that answers with the obligation it changed."""
    return lambda row: response(obligation=obligation_pb(row))


def recorded_pb(recorded: tuple[Obligation, bool]) -> pb.RecordObligationResponse:
    row, created = recorded
    return pb.RecordObligationResponse(obligation=obligation_pb(row), created=created)


def pruned_pb(pruned: int) -> pb.PruneObligationsResponse:
    return pb.PruneObligationsResponse(pruned_count=pruned)


def handed_over_pb(moved: int) -> pb.HandOverObligationsResponse:
    return pb.HandOverObligationsResponse(handed_over_count=moved)


def claimed_pb(result: ClaimResult) -> pb.ClaimRecoverableResponse:
    return pb.ClaimRecoverableResponse(
        obligations=[obligation_pb(row) for row in result.obligations],
        abandoned_count=result.abandoned_count,
        gated_count=result.gated_count,
    )


mutation = Mutations(pb.DESCRIPTOR.services_by_name["DeliveryService"])


class DeliveryServicer(pb_grpc.DeliveryServiceServicer):
    def __init__(self, ledger: Ledger, requests: RequestStore) -> None:
        self.ledger = ledger
        self.requests = requests
        self.carried = CarriedCalls(
            pb.DESCRIPTOR.services_by_name["DeliveryService"],
            lambda server: pb_grpc.add_DeliveryServiceServicer_to_server(self, server),
            pb.CallStreamResponse,
        )

    async def CallStream(  # noqa: N802
        self, request_iterator: AsyncIterator[pb.CallStreamRequest], context: Context
    ) -> AsyncIterator[pb.CallStreamResponse]:
        """Ledger calls carried over one stream (`switchboard.call_stream`)."""
        async for answer in self.carried.serve(request_iterator, context):
            yield answer  # type: ignore[misc]

    @mutation(with_instance(pb.RegisterInstanceResponse))
    async def RegisterInstance(  # noqa: N802
        self, request: pb.RegisterInstanceRequest, context: Context, guard: RequestGuard | None
    ) -> Instance:
        ttl = seconds_given(request, "lease_ttl")
        return await self.ledger.register_instance(
            request.gateway_name,
            request.host,
            request.pid,
            request.platforms,
            ttl,
            caller(),
            guard=guard,
        )

    @mutation(with_instance(pb.HeartbeatResponse))
    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest, context: Context, guard: RequestGuard | None
    ) -> Instance:
        return await self.ledger.heartbeat(
            request.instance_id, request.platforms, caller(), guard=guard
        )

    @mutation(with_instance(pb.DeregisterInstanceResponse))
    async def DeregisterInstance(  # noqa: N802
        self, request: pb.DeregisterInstanceRequest, context: Context, guard: RequestGuard | None
    ) -> Instance:
        return await self.ledger.deregister(request.instance_id, caller(), guard=guard)

    async def GetInstance(  # noqa: N802
        self, request: pb.GetInstanceRequest, context: Context
    ) -> pb.GetInstanceResponse:
        instance, live = await self.ledger.get_instance(request.instance_id, caller())
        return pb.GetInstanceResponse(instance=instance_pb(instance, live))

    @mutation(recorded_pb)
    async def RecordObligation(  # noqa: N802
        self, request: pb.RecordObligationRequest, context: Context, guard: RequestGuard | None
    ) -> tuple[Obligation, bool]:
        new = NewObligation(
            session_key=request.session_key,
            message_ref=request.message_ref,
            content=request.content,
            platform=request.platform,
            chat_id=request.chat_id,
            thread_id=request.thread_id,
            metadata=dict(request.metadata),
            sealed_target=request.sealed_target,
        )
        return await self.ledger.record(
            request.instance_id, new, request.begin_attempt, caller(), guard=guard
        )

    @mutation(with_obligation(pb.MarkAttemptingResponse))
    async def MarkAttempting(  # noqa: N802
        self, request: pb.MarkAttemptingRequest, context: Context, guard: RequestGuard | None
    ) -> Obligation:
        return await self.ledger.mark_attempting(
            request.obligation_id, request.instance_id, request.fence, caller(), guard=guard
        )

    @mutation(with_obligation(pb.MarkDeliveredResponse))
    async def MarkDelivered(  # noqa: N802
        self, request: pb.MarkDeliveredRequest, context: Context, guard: RequestGuard | None
    ) -> Obligation:
        return await self.ledger.mark_delivered(
            request.obligation_id,
            request.instance_id,
            request.fence,
            request.platform_message_id,
            caller(),
            guard=guard,
        )

    @mutation(with_obligation(pb.MarkFailedResponse))
    async def MarkFailed(  # noqa: N802
        self, request: pb.MarkFailedRequest, context: Context, guard: RequestGuard | None
    ) -> Obligation:
        retry_after = seconds_given(request, "retry_after")
        return await self.ledger.mark_failed(
            request.obligation_id,
            request.instance_id,
            request.fence,
            request.error,
            request.retryable,
            retry_after,
            caller(),
            guard=guard,
        )

    @mutation(claimed_pb)
    async def ClaimRecoverable(  # noqa: N802
        self, request: pb.ClaimRecoverableRequest, context: Context, guard: RequestGuard | None
    ) -> ClaimResult:
        deliverable = (
            list(request.deliverable_platforms.platforms)
            if request.HasField("deliverable_platforms")
            else None
        )
        return await self.ledger.claim_recoverable(
            request.instance_id, deliverable, request.limit, caller(), guard=guard
        )

    async def GetObligation(  # noqa: N802
        self, request: pb.GetObligationRequest, context: Context
    ) -> pb.GetObligationResponse:
        row = await self.ledger.get(request.obligation_id, caller())
        return pb.GetObligationResponse(obligation=obligation_pb(row))

    async def ListObligations(  # noqa: N802
        self, request: pb.ListObligationsRequest, context: Context
    ) -> pb.ListObligationsResponse:
        where = ObligationFilter(
            state=state_filter(request.state),
            platform=request.platform,
            session_key=request.session_key,
            owner_instance_id=request.owner_instance_id,
            gateway_name=request.gateway_name,
            agent=request.agent,
            owed_only=request.owed_only,
        )
        page = await self.ledger.list(where, request.page_size, request.page_token, caller())
        return pb.ListObligationsResponse(
            obligations=[obligation_pb(row) for row in page.obligations],
            next_page_token=page.next_page_token,
        )

    async def CountObligations(  # noqa: N802
        self, request: pb.CountObligationsRequest, context: Context
    ) -> pb.CountObligationsResponse:
        where = ObligationFilter(
            state=state_filter(request.state),
            platform=request.platform,
            session_key=request.session_key,
            owner_instance_id=request.owner_instance_id,
            gateway_name=request.gateway_name,
            agent=request.agent,
            owed_only=request.owed_only,
        )
        keys = list(request.session_keys)
        total, by_key = await self.ledger.count(where, keys, caller())
        return pb.CountObligationsResponse(
            count=total,
            session_key_counts=[
                pb.SessionKeyCount(session_key=key, count=by_key.get(key, 0)) for key in keys
            ],
        )

    @mutation(with_obligation(pb.RetryObligationResponse))
    async def RetryObligation(  # noqa: N802
        self, request: pb.RetryObligationRequest, context: Context, guard: RequestGuard | None
    ) -> Obligation:
        return await self.ledger.retry(request.obligation_id, caller(), guard=guard)

    @mutation(with_obligation(pb.AbandonObligationResponse))
    async def AbandonObligation(  # noqa: N802
        self, request: pb.AbandonObligationRequest, context: Context, guard: RequestGuard | None
    ) -> Obligation:
        return await self.ledger.abandon(
            request.obligation_id, request.reason, caller(), guard=guard
        )

    async def GetLedgerStats(  # noqa: N802
        self, request: pb.GetLedgerStatsRequest, context: Context
    ) -> pb.GetLedgerStatsResponse:
        stats = await self.ledger.stats(caller())
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

    @mutation(pruned_pb)
    async def PruneObligations(  # noqa: N802
        self, request: pb.PruneObligationsRequest, context: Context, guard: RequestGuard | None
    ) -> int:
        return await self.ledger.prune(seconds_given(request, "older_than"), caller(), guard=guard)

    @mutation(handed_over_pb)
    async def HandOverObligations(  # noqa: N802
        self, request: pb.HandOverObligationsRequest, context: Context, guard: RequestGuard | None
    ) -> int:
        return await self.ledger.hand_over(
            request.from_gateway_name,
            request.to_gateway_name,
            list(request.obligation_ids),
            caller(),
            request.from_no_gateway,
            guard=guard,
        )

    async def ListInstances(  # noqa: N802
        self, request: pb.ListInstancesRequest, context: Context
    ) -> pb.ListInstancesResponse:
        page: InstancePage = await self.ledger.list_instances(
            request.gateway_name,
            request.live_only,
            request.page_size,
            request.page_token,
            caller(),
        )
        return pb.ListInstancesResponse(
            instances=[
                pb.InstanceSummary(
                    instance=instance_pb(summary.instance, summary.live),
                    held_count=summary.held_count,
                )
                for summary in page.instances
            ],
            next_page_token=page.next_page_token,
        )
