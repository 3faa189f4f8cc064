"""A typed, synchronous client for the DeliveryService (the delivery ledger).

A gateway records every final reply before sending it, marks it attempting and
delivered around the platform send, and on start claims what dead instances
left owed. This client wraps the generated stub so that every call has a
deadline, transient outages of idempotent calls are retried by gRPC itself, and
every failure surfaces as one exception type, `SwitchboardError`.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard_client._base import MAX_CALL_TIMEOUT as MAX_CALL_TIMEOUT
from switchboard_client._base import MUTATION_ATTEMPTS, BaseClient, service_config
from switchboard_client._base import duration as _duration
from switchboard_client.errors import SwitchboardError

log = logging.getLogger("switchboard_client")

SERVICE_NAME = "switchboard.delivery.v1.DeliveryService"

#: Reads: safe to send twice.
READ_METHODS: tuple[str, ...] = (
    "GetInstance",
    "GetObligation",
    "ListObligations",
    "GetLedgerStats",
    "ListInstances",
    "CountObligations",
)
#: Writes: each carries a request id (one per logical call, the same on every
#: retry), so the server answers a retry of a committed call without running it
#: again. `BaseClient._call` sets the id and retries them with a fresh deadline.
REQUEST_ID_METHODS: tuple[str, ...] = (
    "RegisterInstance",
    "Heartbeat",
    "DeregisterInstance",
    "RecordObligation",
    "MarkAttempting",
    "MarkDelivered",
    "MarkFailed",
    "ClaimRecoverable",
    "RetryObligation",
    "AbandonObligation",
    "PruneObligations",
    "HandOverObligations",
)
#: Retried on UNAVAILABLE by the channel: every method of the service.
RETRYABLE_METHODS: tuple[str, ...] = READ_METHODS + REQUEST_ID_METHODS

#: gRPC service config: a timeout for every method of the service (the nameless
#: entry covers methods added later, which stay unretried until reviewed) and a
#: retry on UNAVAILABLE for the reads and the writes that carry a request id.
SERVICE_CONFIG: dict[str, Any] = service_config(SERVICE_NAME, RETRYABLE_METHODS)


class DeliveryClient(BaseClient):
    """The DeliveryService for one gateway process (thread-safe, like its channel).

    Every method raises `SwitchboardError` on failure, except `record_best_effort`,
    which never raises.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 5.0,
        best_effort_timeout_s: float = 2.0,
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
        self.best_effort_timeout_s = best_effort_timeout_s
        self._stub = pb_grpc.DeliveryServiceStub(self._channel)

    # -- gateway instances ----------------------------------------------------------------

    def register(
        self,
        gateway_name: str,
        platforms: Sequence[str],
        *,
        host: str | None = None,
        pid: int | None = None,
        lease_ttl_s: float | None = None,
        request_id: str = "",
    ) -> pb.Instance:
        """Registers this process start; call once per process, never on a retry loop.

        `host` and `pid` default to this host and this process, read at call time
        (so a forked worker reports its own pid). `lease_ttl_s` None takes the
        server's default lease.
        """
        request = pb.RegisterInstanceRequest(
            gateway_name=gateway_name,
            host=socket.gethostname() if host is None else host,
            pid=os.getpid() if pid is None else pid,
            platforms=platforms,
        )
        if lease_ttl_s is not None:
            request.lease_ttl.CopyFrom(_duration(lease_ttl_s))
        return self._call(self._stub.RegisterInstance, request, request_id=request_id).instance

    def heartbeat(
        self, instance_id: str, platforms: Sequence[str], *, request_id: str = ""
    ) -> pb.Instance:
        """Extends the lease; `platforms` replaces the connected set (it gates claims)."""
        request = pb.HeartbeatRequest(instance_id=instance_id, platforms=platforms)
        return self._call(self._stub.Heartbeat, request, request_id=request_id).instance

    def deregister(self, instance_id: str, *, request_id: str = "") -> pb.Instance:
        """Graceful stop: this instance's unfinished rows become claimable at once."""
        request = pb.DeregisterInstanceRequest(instance_id=instance_id)
        return self._call(self._stub.DeregisterInstance, request, request_id=request_id).instance

    def instance(self, instance_id: str) -> pb.Instance:
        """Reads an instance; `live` is judged on the server's database clock now.

        An unknown id raises `SwitchboardError` with code NOT_FOUND.
        """
        request = pb.GetInstanceRequest(instance_id=instance_id)
        return self._call(self._stub.GetInstance, request).instance

    # -- the send path --------------------------------------------------------------------

    def record(
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
    ) -> pb.RecordObligationResponse:
        """Records a reply as owed before sending it; recording it again is harmless.

        `begin_attempt` records it straight into ATTEMPTING (saves MarkAttempting).
        `sealed_target` (`switchboard_client.reply_targets`) stands in for `chat_id`
        and `thread_id`, which are then empty: how a reply is recorded without a raw id.
        Decide what to do from the returned row (state, owner_instance_id), not from
        `created`: this call's own retries (one request id) report the first answer,
        but a new call recording the same reply reports created=False while this
        instance may still hold it. `attempts` bounds this call's attempts (default:
        the client's `mutation_attempts`).
        """
        request = pb.RecordObligationRequest(
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
        return self._call(
            self._stub.RecordObligation,
            request,
            timeout_s,
            request_id=request_id,
            attempts=attempts,
        )

    def record_best_effort(
        self,
        instance_id: str,
        *,
        session_key: str,
        content: str,
        platform: str,
        **fields: Any,
    ) -> pb.RecordObligationResponse | None:
        """`record` for the send path: the ledger must never block or break a send.

        Takes `record`'s arguments. Uses the short `best_effort_timeout_s` deadline;
        on any failure it logs a warning and returns None, and the caller sends the
        reply unrecorded.
        """
        try:
            return self.record(
                instance_id,
                session_key=session_key,
                content=content,
                platform=platform,
                timeout_s=self.best_effort_timeout_s,
                attempts=1,  # the send must not wait for retries (the channel's are quick)
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

    def mark_attempting(
        self, instance_id: str, obligation: pb.Obligation, *, request_id: str = ""
    ) -> pb.Obligation:
        """Just before the platform send: from now on a crash means "maybe sent"."""
        request = pb.MarkAttemptingRequest(
            obligation_id=obligation.id, instance_id=instance_id, fence=obligation.fence
        )
        return self._call(self._stub.MarkAttempting, request, request_id=request_id).obligation

    def mark_delivered(
        self,
        instance_id: str,
        obligation: pb.Obligation,
        platform_message_id: str = "",
        *,
        request_id: str = "",
    ) -> pb.Obligation:
        """The platform accepted the message; the row is done."""
        request = pb.MarkDeliveredRequest(
            obligation_id=obligation.id,
            instance_id=instance_id,
            fence=obligation.fence,
            platform_message_id=platform_message_id,
        )
        return self._call(self._stub.MarkDelivered, request, request_id=request_id).obligation

    def mark_failed(
        self,
        instance_id: str,
        obligation: pb.Obligation,
        error: str,
        *,
        retryable: bool,
        retry_after_s: float | None = None,
        request_id: str = "",
    ) -> pb.Obligation:
        """The send failed: retryable rows come back via claims, others are abandoned.

        `retry_after_s` carries a platform's flood-control delay (HTTP 429);
        None uses the server's backoff schedule.
        """
        request = pb.MarkFailedRequest(
            obligation_id=obligation.id,
            instance_id=instance_id,
            fence=obligation.fence,
            error=error,
            retryable=retryable,
        )
        if retry_after_s is not None:
            request.retry_after.CopyFrom(_duration(retry_after_s))
        return self._call(self._stub.MarkFailed, request, request_id=request_id).obligation

    def claim_recoverable(
        self,
        instance_id: str,
        *,
        deliverable_platforms: Sequence[str] | None = None,
        limit: int = 0,
        request_id: str = "",
    ) -> pb.ClaimRecoverableResponse:
        """Takes over owed rows of dead instances (and due retries) for redelivery.

        `deliverable_platforms` None uses the platforms of this instance's latest
        heartbeat; an empty sequence means "none right now" (nothing is claimed).
        A claimed row with `needs_marker` may have reached the platform already.
        """
        request = pb.ClaimRecoverableRequest(instance_id=instance_id, limit=limit)
        if deliverable_platforms is not None:
            # SetInParent: an empty set must still be sent as a present (empty) message.
            request.deliverable_platforms.SetInParent()
            request.deliverable_platforms.platforms.extend(deliverable_platforms)
        return self._call(self._stub.ClaimRecoverable, request, request_id=request_id)

    # -- operators ------------------------------------------------------------------------

    def get(self, obligation_id: str) -> pb.Obligation:
        """Reads one obligation."""
        request = pb.GetObligationRequest(obligation_id=obligation_id)
        return self._call(self._stub.GetObligation, request).obligation

    def list(
        self,
        *,
        state: pb.ObligationState.ValueType = pb.OBLIGATION_STATE_UNSPECIFIED,
        platform: str = "",
        session_key: str = "",
        owner_instance_id: str = "",
        gateway_name: str = "",
        page_size: int = 0,
    ) -> Iterator[pb.Obligation]:
        """Every matching row, oldest first, fetching pages lazily as iteration goes.

        Each page is its own call with its own deadline; `page_size` 0 takes the
        server's default. An agent or gateway token sees rows of its agents only.
        """
        request = pb.ListObligationsRequest(
            state=state,
            platform=platform,
            session_key=session_key,
            owner_instance_id=owner_instance_id,
            gateway_name=gateway_name,
            page_size=page_size,
        )
        for page in self._pages(self._stub.ListObligations, request):
            yield from page.obligations

    def list_instances(
        self, *, gateway_name: str = "", live_only: bool = False, page_size: int = 0
    ) -> Iterator[pb.InstanceSummary]:
        """Gateway instances (admin), the latest registered first, each with `live`
        judged on the database's clock and `held_count`, the owed rows it holds.

        Pages are fetched lazily as iteration goes; `page_size` 0 takes the server's
        default.
        """
        request = pb.ListInstancesRequest(
            gateway_name=gateway_name, live_only=live_only, page_size=page_size
        )
        for page in self._pages(self._stub.ListInstances, request):
            yield from page.instances

    def retry(self, obligation_id: str, *, request_id: str = "") -> pb.Obligation:
        """Operator action (admin): makes a FAILED or ABANDONED row due now, attempts reset."""
        request = pb.RetryObligationRequest(obligation_id=obligation_id)
        return self._call(self._stub.RetryObligation, request, request_id=request_id).obligation

    def abandon(
        self, obligation_id: str, reason: str = "", *, request_id: str = ""
    ) -> pb.Obligation:
        """Operator action (admin): gives up on a row that is still owed."""
        request = pb.AbandonObligationRequest(obligation_id=obligation_id, reason=reason)
        return self._call(self._stub.AbandonObligation, request, request_id=request_id).obligation

    def stats(self) -> pb.GetLedgerStatsResponse:
        """Ledger health (admin): counts per state, oldest pending age, rows in doubt,
        gated rows."""
        return self._call(self._stub.GetLedgerStats, pb.GetLedgerStatsRequest())

    def prune(self, older_than_s: float | None = None, *, request_id: str = "") -> int:
        """Deletes terminal rows older than `older_than_s` (None or 0: server retention).

        Returns how many rows were deleted. Admin only.
        """
        request = pb.PruneObligationsRequest()
        if older_than_s is not None:
            request.older_than.CopyFrom(_duration(older_than_s))
        return self._call(self._stub.PruneObligations, request, request_id=request_id).pruned_count

    def hand_over(
        self,
        from_gateway_name: str,
        to_gateway_name: str,
        obligation_ids: Sequence[str] = (),
        *,
        from_no_gateway: bool = False,
        request_id: str = "",
    ) -> int:
        """Operator action (admin): binds owed rows of one gateway to another, so that
        the other's instances claim them once they are recoverable.

        `obligation_ids` empty moves every owed row of `from_gateway_name`; otherwise
        only those rows. The rows of no known gateway are moved with
        `from_gateway_name=""` and `from_no_gateway=True` (the server refuses an empty
        name without it). Returns how many moved.
        """
        request = pb.HandOverObligationsRequest(
            from_gateway_name=from_gateway_name,
            to_gateway_name=to_gateway_name,
            obligation_ids=obligation_ids,
            from_no_gateway=from_no_gateway,
        )
        answer = self._call(self._stub.HandOverObligations, request, request_id=request_id)
        return answer.handed_over_count


__all__ = ["RETRYABLE_METHODS", "SERVICE_CONFIG", "DeliveryClient", "SwitchboardError"]
