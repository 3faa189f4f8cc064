"""Every request of the DeliveryService, built once for the blocking and the asyncio
clients (`DeliveryClient`, `AsyncDeliveryClient`): each function takes a client
method's arguments and describes its call (`switchboard_client._calls`)."""

from __future__ import annotations

import functools
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Any

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard_client._base import duration as _duration
from switchboard_client._calls import Call, Pages

log = logging.getLogger("switchboard_client")

# -- gateway instances ----------------------------------------------------------------


def register(
    gateway_name: str,
    platforms: Sequence[str],
    *,
    host: str | None = None,
    pid: int | None = None,
    lease_ttl_s: float | None = None,
    request_id: str = "",
) -> Call[pb.Instance]:
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
    return Call("RegisterInstance", request, attrgetter("instance"), request_id=request_id)


def heartbeat(
    instance_id: str, platforms: Sequence[str], *, request_id: str = ""
) -> Call[pb.Instance]:
    """Extends the lease; `platforms` replaces the connected set (it gates claims)."""
    request = pb.HeartbeatRequest(instance_id=instance_id, platforms=platforms)
    return Call("Heartbeat", request, attrgetter("instance"), request_id=request_id)


def deregister(instance_id: str, *, request_id: str = "") -> Call[pb.Instance]:
    """Graceful stop: this instance's unfinished rows become claimable at once."""
    request = pb.DeregisterInstanceRequest(instance_id=instance_id)
    return Call("DeregisterInstance", request, attrgetter("instance"), request_id=request_id)


def instance(instance_id: str) -> Call[pb.Instance]:
    """Reads an instance; `live` is judged on the server's database clock now.

    An unknown id raises `SwitchboardError` with code NOT_FOUND.
    """
    request = pb.GetInstanceRequest(instance_id=instance_id)
    return Call("GetInstance", request, attrgetter("instance"))


# -- the send path --------------------------------------------------------------------


def record(
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
) -> Call[pb.RecordObligationResponse]:
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
    return Call(
        "RecordObligation", request, request_id=request_id, timeout_s=timeout_s, attempts=attempts
    )


def record_best_effort(
    instance_id: str,
    *,
    session_key: str,
    content: str,
    platform: str,
    **fields: Any,
) -> Call[pb.RecordObligationResponse | None]:
    """`record` for the send path: the ledger must never block or break a send.

    Takes `record`'s arguments. Uses the short `best_effort_timeout_s` deadline;
    on any failure it logs a warning and returns None, and the caller sends the
    reply unrecorded.
    """
    try:
        recorded = record(
            instance_id, session_key=session_key, content=content, platform=platform, **fields
        )
    except Exception as error:  # e.g. metadata that is not text: not recorded either
        recorded = Call("RecordObligation", None, unbuilt=error)
    return Call(
        recorded.method,
        recorded.request,
        request_id=recorded.request_id,
        unbuilt=recorded.unbuilt,
        attempts=1,  # the send must not wait for retries (the channel's are quick)
        short_deadline=True,
        fallback=functools.partial(_unrecorded, session_key, platform),
    )


def mark_attempting(
    instance_id: str, obligation: pb.Obligation, *, request_id: str = ""
) -> Call[pb.Obligation]:
    """Just before the platform send: from now on a crash means "maybe sent"."""
    request = pb.MarkAttemptingRequest(
        obligation_id=obligation.id, instance_id=instance_id, fence=obligation.fence
    )
    return Call("MarkAttempting", request, attrgetter("obligation"), request_id=request_id)


def mark_delivered(
    instance_id: str,
    obligation: pb.Obligation,
    platform_message_id: str = "",
    *,
    request_id: str = "",
) -> Call[pb.Obligation]:
    """The platform accepted the message; the row is done."""
    request = pb.MarkDeliveredRequest(
        obligation_id=obligation.id,
        instance_id=instance_id,
        fence=obligation.fence,
        platform_message_id=platform_message_id,
    )
    return Call("MarkDelivered", request, attrgetter("obligation"), request_id=request_id)


def mark_failed(
    instance_id: str,
    obligation: pb.Obligation,
    error: str,
    *,
    retryable: bool,
    retry_after_s: float | None = None,
    request_id: str = "",
) -> Call[pb.Obligation]:
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
    return Call("MarkFailed", request, attrgetter("obligation"), request_id=request_id)


def claim_recoverable(
    instance_id: str,
    *,
    deliverable_platforms: Sequence[str] | None = None,
    limit: int = 0,
    request_id: str = "",
) -> Call[pb.ClaimRecoverableResponse]:
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
    return Call("ClaimRecoverable", request, request_id=request_id)


# -- operators ------------------------------------------------------------------------


def get(obligation_id: str) -> Call[pb.Obligation]:
    """Reads one obligation."""
    request = pb.GetObligationRequest(obligation_id=obligation_id)
    return Call("GetObligation", request, attrgetter("obligation"))


def list_obligations(
    *,
    state: pb.ObligationState.ValueType = pb.OBLIGATION_STATE_UNSPECIFIED,
    platform: str = "",
    session_key: str = "",
    owner_instance_id: str = "",
    gateway_name: str = "",
    page_size: int = 0,
) -> Pages[pb.Obligation]:
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
    return Pages("ListObligations", request, attrgetter("obligations"))


def list_instances(
    *, gateway_name: str = "", live_only: bool = False, page_size: int = 0
) -> Pages[pb.InstanceSummary]:
    """Gateway instances (admin), the latest registered first, each with `live`
    judged on the database's clock and `held_count`, the owed rows it holds.

    Pages are fetched lazily as iteration goes; `page_size` 0 takes the server's
    default.
    """
    request = pb.ListInstancesRequest(
        gateway_name=gateway_name, live_only=live_only, page_size=page_size
    )
    return Pages("ListInstances", request, attrgetter("instances"))


def retry(obligation_id: str, *, request_id: str = "") -> Call[pb.Obligation]:
    """Operator action (admin): makes a FAILED or ABANDONED row due now, attempts reset."""
    request = pb.RetryObligationRequest(obligation_id=obligation_id)
    return Call("RetryObligation", request, attrgetter("obligation"), request_id=request_id)


def abandon(obligation_id: str, reason: str = "", *, request_id: str = "") -> Call[pb.Obligation]:
    """Operator action (admin): gives up on a row that is still owed."""
    request = pb.AbandonObligationRequest(obligation_id=obligation_id, reason=reason)
    return Call("AbandonObligation", request, attrgetter("obligation"), request_id=request_id)


def stats() -> Call[pb.GetLedgerStatsResponse]:
    """Ledger health (admin): counts per state, oldest pending age, rows in doubt,
    gated rows."""
    return Call("GetLedgerStats", pb.GetLedgerStatsRequest())


def prune(older_than_s: float | None = None, *, request_id: str = "") -> Call[int]:
    """Deletes terminal rows older than `older_than_s` (None or 0: server retention).

    Returns how many rows were deleted. Admin only.
    """
    request = pb.PruneObligationsRequest()
    if older_than_s is not None:
        request.older_than.CopyFrom(_duration(older_than_s))
    return Call("PruneObligations", request, attrgetter("pruned_count"), request_id=request_id)


def hand_over(
    from_gateway_name: str,
    to_gateway_name: str,
    obligation_ids: Sequence[str] = (),
    *,
    from_no_gateway: bool = False,
    request_id: str = "",
) -> Call[int]:
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
    return Call(
        "HandOverObligations", request, attrgetter("handed_over_count"), request_id=request_id
    )


def _unrecorded(session_key: str, platform: str, error: Exception) -> None:
    """A best-effort record failed: logged, and the reply is sent unrecorded."""
    # Content is left out of the log on purpose: it is the user's message.
    log.warning(
        "delivery ledger: reply not recorded, sending it unrecorded "
        "(session_key=%r, platform=%r): %s",
        session_key,
        platform,
        error,
    )
