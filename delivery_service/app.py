"""Wires the DeliveryService together: database → store → ledger → servicer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from delivery_service.ledger import Ledger
from delivery_service.migrations import DELIVERY_SCHEMA
from delivery_service.redaction import LedgerRedactor
from delivery_service.servicer import DeliveryServicer
from delivery_service.state_machine import LedgerLimits
from delivery_service.store import LedgerStore
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.call_stream import CarriedCalls
from switchboard.database import Backend, DatabaseSettings, SettingsMismatch
from switchboard.delivery.v1 import delivery_service_pb2, delivery_service_pb2_grpc
from switchboard.idempotency import LEDGER_REQUESTS, RequestStore
from switchboard.interceptor_chain import InterceptorChain
from switchboard.runner import TransactionRunner
from switchboard.shared_settings import SharedSettings, shared

#: Postgres writer threads unless configured. Several: the ledger's rows are independent
#: (no lock every write takes), so transactions of several writers overlap on the database.
WRITER_THREADS = 4

SERVICE_NAME = delivery_service_pb2.DESCRIPTOR.services_by_name["DeliveryService"].full_name
#: The ledger and the remembered calls: health reports NOT_SERVING while a write cannot
#: lock them.
WRITTEN_TABLES = ("ledger_obligation", "ledger_instance", LEDGER_REQUESTS)


def agreed_limits(backend: Backend, limits: LedgerLimits, policy: SettingsMismatch) -> LedgerLimits:
    """The limits every replica on the database must share, checked against the
    stored ones (see `switchboard.shared_settings`); the content cap and claim
    size are per call, so replicas may differ on them during a rollout. The
    request-id window is shared too: a replica with a shorter one would run again
    retries the others answer, and its pruning would delete their records."""
    agreed = SharedSettings(backend).agree(
        shared(
            {
                "max_attempts": ("--max-attempts", limits.max_attempts),
                "stale_after_s": ("--stale-after", limits.stale_after_s),
                "retention_s": ("--retention", limits.retention_s),
                "lease_ttl_s": ("--lease-ttl", limits.lease_ttl_s),
                "backoff_s": ("--backoff", list(limits.backoff_s)),
                "request_id_window_s": ("--request-id-window", limits.request_id_window_s),
            },
            "delivery",
        ),
        policy,
    )
    return replace(
        limits,
        max_attempts=int(agreed["delivery.max_attempts"]),
        stale_after_s=float(agreed["delivery.stale_after_s"]),
        retention_s=float(agreed["delivery.retention_s"]),
        lease_ttl_s=float(agreed["delivery.lease_ttl_s"]),
        backoff_s=tuple(float(step) for step in agreed["delivery.backoff_s"]),
        request_id_window_s=float(agreed["delivery.request_id_window_s"]),
    )


class DeliveryUnit:
    """The DeliveryService with its storage, ready to mount on a server."""

    service_name = SERVICE_NAME

    def __init__(
        self,
        database: DatabaseSettings,
        limits: LedgerLimits | None = None,
        *,
        migrate: bool = True,
        pii_key: bytes | None = None,
    ) -> None:
        """`migrate`: apply pending schema migrations (off: refuse to start when behind).
        `pii_key`: the secret that hashes session keys, with reply targets accepted
        only sealed (None: stored as given). Raises `switchboard.migrations.SchemaError`
        when the schema cannot be used, `PiiKeyRefused` for a key too short."""
        redactor = LedgerRedactor(pii_key)
        database = replace(database, writer_threads=database.writer_threads or WRITER_THREADS)
        backend = open_backend(database)
        migrations.prepare(backend, DELIVERY_SCHEMA, migrate_behind=migrate)
        wanted = limits or LedgerLimits()
        self.limits = agreed_limits(backend, wanted, database.on_settings_mismatch)
        self.store = LedgerStore(backend, self.limits)
        self.runner = TransactionRunner(backend, database, written_tables=WRITTEN_TABLES)
        self.requests = RequestStore(
            backend,
            LEDGER_REQUESTS,
            self.limits.request_id_window_s,
            fingerprint_key=redactor.fingerprint_key(),
        )
        self.ledger = Ledger(self.runner, self.store, self.limits, redactor)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        self.servicer = DeliveryServicer(self.ledger, self.requests)
        delivery_service_pb2_grpc.add_DeliveryServiceServicer_to_server(self.servicer, server)

    def carry_calls_through(self, chain: InterceptorChain) -> CarriedCalls:
        """CallStream serves the calls it carries through the server's interceptors."""
        self.servicer.carried.serve_through(chain)
        return self.servicer.carried

    def close(self) -> None:
        self.runner.close()

    def probe(self) -> None:
        """Raises `Unavailable` unless the database answers now (health checking)."""
        self.runner.probe()

    def gauges(self) -> Iterable[Metric]:
        """Ledger gauges for Prometheus, read at scrape time."""
        stats = self.runner.submit_read(lambda: self.store.stats(self.store.backend.now()))
        result = stats.result(timeout=10)
        rows = GaugeMetricFamily(
            "switchboard_ledger_rows", "Obligations by state.", labels=["state"]
        )
        for state, count in result.state_counts.items():
            rows.add_metric([state.value], count)
        gated = GaugeMetricFamily(
            "switchboard_ledger_gated_rows",
            "Recoverable rows whose platform no live instance has connected.",
            labels=["platform"],
        )
        for platform, count in result.gated_by_platform.items():
            gated.add_metric([platform], count)
        yield rows
        yield gated
        yield GaugeMetricFamily(
            "switchboard_ledger_oldest_pending_age_seconds",
            "Age of the oldest pending obligation.",
            value=result.oldest_pending_age_s,
        )
        yield GaugeMetricFamily(
            "switchboard_ledger_in_doubt_rows",
            "Attempting rows whose owner died: the send may or may not have happened.",
            value=result.in_doubt_count,
        )
        yield GaugeMetricFamily(
            "switchboard_ledger_live_instances",
            "Live gateway instances.",
            value=result.live_instance_count,
        )
