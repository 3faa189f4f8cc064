"""A typed, synchronous client for the DeliveryService (the delivery ledger).

A gateway records every final reply before sending it, marks it attempting and
delivered around the platform send, and on start claims what dead instances
left owed. This client wraps the generated stub so that every call has a
deadline, transient outages of idempotent calls are retried by gRPC itself, and
every failure surfaces as one exception type, `SwitchboardError`.
"""

from __future__ import annotations

import logging
from typing import Any

from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from switchboard_client import _delivery_calls as calls
from switchboard_client._base import MAX_CALL_TIMEOUT as MAX_CALL_TIMEOUT
from switchboard_client._base import BaseClient, blocking, blocking_pages, service_config
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
    which never raises. Each builds its request in
    `switchboard_client._delivery_calls`, where its docstring is.
    """

    SERVICE_CONFIG = SERVICE_CONFIG
    STUB = pb_grpc.DeliveryServiceStub
    _stub: pb_grpc.DeliveryServiceStub

    # -- gateway instances ----------------------------------------------------------------
    register = blocking(calls.register)
    heartbeat = blocking(calls.heartbeat)
    deregister = blocking(calls.deregister)
    instance = blocking(calls.instance)

    # -- the send path --------------------------------------------------------------------
    record = blocking(calls.record)
    record_best_effort = blocking(calls.record_best_effort)
    mark_attempting = blocking(calls.mark_attempting)
    mark_delivered = blocking(calls.mark_delivered)
    mark_failed = blocking(calls.mark_failed)
    claim_recoverable = blocking(calls.claim_recoverable)

    # -- operators ------------------------------------------------------------------------
    get = blocking(calls.get)
    list = blocking_pages(calls.list_obligations)
    list_instances = blocking_pages(calls.list_instances)
    retry = blocking(calls.retry)
    abandon = blocking(calls.abandon)
    stats = blocking(calls.stats)
    prune = blocking(calls.prune)
    hand_over = blocking(calls.hand_over)


__all__ = ["RETRYABLE_METHODS", "SERVICE_CONFIG", "DeliveryClient", "SwitchboardError"]
