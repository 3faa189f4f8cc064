"""The console's calls to the two services: the asyncio clients of switchboard_client,
one channel per service shared by every login, each call made with the login's token.

The asyncio clients cover what a gateway needs; the operator calls the console makes
are added here on the same call discipline (deadlines, a fresh request id per write
kept across its retries, `SwitchboardError`s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from switchboard_client._base import channel_options
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.delivery import SERVICE_CONFIG as DELIVERY_SERVICE_CONFIG
from switchboard_client.session import SERVICE_CONFIG as SESSION_SERVICE_CONFIG

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb


class SessionCalls(AsyncSessionClient):
    """The SessionService calls the console's pages make."""

    async def list_log(self, request: pb.ListLogEventsRequest) -> pb.ListLogEventsResponse:
        return await self._call(self._stub.ListLogEvents, request)

    async def list_sessions(self, request: pb.ListSessionsRequest) -> pb.ListSessionsResponse:
        return await self._call(self._stub.ListSessions, request)

    async def list_checkpoints(
        self, min_sequence: int = 0, page_size: int = 100
    ) -> list[pb.Checkpoint]:
        request = pb.ListCheckpointsRequest(min_sequence=min_sequence, page_size=page_size)
        return list((await self._call(self._stub.ListCheckpoints, request)).checkpoints)

    async def state_at(
        self, agent: str, session_id: str, at_sequence: int
    ) -> pb.GetSessionStateResponse:
        request = pb.GetSessionStateRequest(
            agent=agent, session_id=session_id, at_sequence=at_sequence
        )
        return await self._call(self._stub.GetSessionState, request)

    async def history_page(self, request: pb.GetHistoryRequest) -> pb.GetHistoryResponse:
        return await self._call(self._stub.GetHistory, request)

    async def rewind(self, request: pb.RewindRequest) -> pb.RewindResponse:
        return await self._call(self._stub.Rewind, request)

    async def checkout(self, request: pb.CheckoutRequest) -> pb.CheckoutResponse:
        return await self._call(self._stub.Checkout, request)

    async def record_action(self, action: str, subject: str, detail: str) -> pb.Event:
        request = pb.RecordOperatorActionRequest(action=action, subject=subject, detail=detail)
        answer = await self._call(self._stub.RecordOperatorAction, request)
        return answer.event


class DeliveryCalls(AsyncDeliveryClient):
    """The DeliveryService calls the console's pages make."""

    async def list_page(self, request: dpb.ListObligationsRequest) -> dpb.ListObligationsResponse:
        return await self._call(self._stub.ListObligations, request)

    async def count(self, request: dpb.CountObligationsRequest) -> dpb.CountObligationsResponse:
        return await self._call(self._stub.CountObligations, request)

    async def stats(self) -> dpb.GetLedgerStatsResponse:
        return await self._call(self._stub.GetLedgerStats, dpb.GetLedgerStatsRequest())

    async def instances(self, page_size: int = 100) -> list[dpb.InstanceSummary]:
        request = dpb.ListInstancesRequest(page_size=page_size)
        return list((await self._call(self._stub.ListInstances, request)).instances)

    async def retry(self, obligation_id: str) -> dpb.Obligation:
        request = dpb.RetryObligationRequest(obligation_id=obligation_id)
        return (await self._call(self._stub.RetryObligation, request)).obligation

    async def abandon(self, obligation_id: str, reason: str) -> dpb.Obligation:
        request = dpb.AbandonObligationRequest(obligation_id=obligation_id, reason=reason)
        answer = await self._call(self._stub.AbandonObligation, request)
        return answer.obligation

    async def hand_over(self, from_gateway: str, to_gateway: str, ids: Sequence[str]) -> int:
        request = dpb.HandOverObligationsRequest(
            from_gateway_name=from_gateway, to_gateway_name=to_gateway, obligation_ids=ids
        )
        answer = await self._call(self._stub.HandOverObligations, request)
        return answer.handed_over_count


@dataclass
class Channels:
    """One channel per service for the whole console (created in its event loop)."""

    session_target: str
    delivery_target: str
    session: grpc.aio.Channel | None = None
    delivery: grpc.aio.Channel | None = None

    def open(self) -> None:
        self.session = grpc.aio.insecure_channel(
            self.session_target, options=channel_options(SESSION_SERVICE_CONFIG)
        )
        self.delivery = grpc.aio.insecure_channel(
            self.delivery_target, options=channel_options(DELIVERY_SERVICE_CONFIG)
        )

    async def close(self) -> None:
        for channel in (self.session, self.delivery):
            if channel is not None:
                await channel.close()

    def sessions(self, token: str) -> SessionCalls:
        assert self.session is not None, "channels are opened at start"
        return SessionCalls(self.session_target, channel=self.session, token=token or None)

    def deliveries(self, token: str) -> DeliveryCalls:
        assert self.delivery is not None, "channels are opened at start"
        return DeliveryCalls(self.delivery_target, channel=self.delivery, token=token or None)
