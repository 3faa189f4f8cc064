"""Wires the SessionService together: database → log store → core → servicer."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from session_service import key_migration, pii, recovery
from session_service.core import Core, SessionLimits
from session_service.log_store import LogStore
from session_service.migrations import SESSION_SCHEMA
from session_service.servicer import SessionServicer
from switchboard import migrations
from switchboard.database import DatabaseSettings, open_backend
from switchboard.idempotency import SESSION_REQUESTS, RequestStore
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2, session_service_pb2_grpc

SERVICE_NAME = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
log = logging.getLogger(__name__)


class SessionUnit:
    """The SessionService with its storage, verified and ready to mount on a server."""

    service_name = SERVICE_NAME

    def __init__(
        self,
        database: DatabaseSettings,
        limits: SessionLimits | None = None,
        *,
        migrate: bool = True,
        pii_key: bytes | None = None,
    ) -> None:
        """`migrate`: apply pending schema migrations (off: refuse to start when behind).
        `pii_key`: the secret that hashes the ids of agents with `redact_pii` (None:
        unkeyed, warned about). Raises `switchboard.migrations.SchemaError` when the
        schema cannot be used, `pii.PiiKeyRefused` for a key too short."""
        self.limits = limits or SessionLimits()
        redactor = pii.Redactor(pii_key)
        if not redactor.keyed:
            log.warning(pii.UNKEYED_WARNING)
        backend = open_backend(database)
        migrations.prepare(backend, SESSION_SCHEMA, migrate_behind=migrate)
        self.store = LogStore(backend)
        self.runner = TransactionRunner(backend, database, begin_write=self.store.lock_log)
        self.requests = RequestStore(
            backend,
            SESSION_REQUESTS,
            self.limits.request_id_window_s,
            fingerprint_key=redactor.fingerprint_key(),
        )
        self.core = Core(self.runner, self.store, self.limits, redactor)
        self.head = recovery.verify(self.core)
        recovery.fill_summaries(self.core)
        key_migration.announce(self.store)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(
            SessionServicer(self.core, self.requests), server
        )

    def close(self) -> None:
        self.core.watching.close()
        self.runner.close()

    def probe(self) -> None:
        """Raises `Unavailable` unless the database answers now (health checking)."""
        self.runner.probe()

    def gauges(self) -> Iterable[Metric]:
        """Log gauges for Prometheus, read at scrape time."""
        head, lag = self.runner.submit_read(self.store.head_and_snapshot_lag).result(timeout=10)
        yield GaugeMetricFamily(
            "switchboard_log_head_sequence", "The newest sequence of the global log.", value=head
        )
        yield GaugeMetricFamily(
            "switchboard_snapshot_lag_events",
            "The most events any session has appended since its latest snapshot.",
            value=lag,
        )
