"""The SessionService ready to serve: its database checked and migrated, the settings
replicas share agreed, the core built (`composition`) and the servicer mounted."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterable
from dataclasses import replace

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from session_service import key_migration, pii, recovery
from session_service.composition import build_core, build_parts
from session_service.core import SessionLimits
from session_service.migrations import SESSION_SCHEMA
from session_service.servicer import SessionServicer
from session_service.storage.erasure_store import REQUEST_SUBJECTS
from switchboard import migrations
from switchboard.backends import open_backend
from switchboard.call_stream import CarriedCalls
from switchboard.database import Backend, DatabaseSettings, SettingsMismatch
from switchboard.idempotency import SESSION_REQUESTS, RequestStore
from switchboard.interceptor_chain import InterceptorChain
from switchboard.session.v1 import session_service_pb2, session_service_pb2_grpc
from switchboard.shared_settings import SESSION_SETTINGS, Shared, SharedSettings

#: Postgres writer threads unless configured. One: every write of this service takes the
#: log's one lock (the head row) in turn, so more threads only split what one group
#: commit would carry into several transactions, each holding that lock for its round
#: trips (measured: docs/performance.md, 2026-12-07 evening).
WRITER_THREADS = 1

SERVICE_NAME = session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name
log = logging.getLogger(__name__)
#: The stored PII key name of replicas without a key (ids hashed unkeyed).
NO_PII_KEY = "none"


def pii_key_id(key: bytes | None) -> str:
    """Names the PII key without giving it away (a keyed digest of a constant), so that
    replicas can tell whether they hash ids alike."""
    if key is None:
        return NO_PII_KEY
    return hmac.new(key, b"switchboard pii key id", hashlib.sha256).hexdigest()[:16]


def agreed_limits(
    backend: Backend, limits: SessionLimits, pii_key: bytes | None, policy: SettingsMismatch
) -> SessionLimits:
    """The settings every replica on the database must share, checked against the stored
    ones (see `switchboard.shared_settings`): the request-id window (a replica with a
    shorter one runs again retries the others would answer, and its pruning deletes
    their records) and the PII key (replicas with different keys route one person's
    conversation to two sessions, and refuse each other's retries as REQUEST_ID_REUSED,
    the fingerprints being keyed). The rest of `SessionLimits` is per replica: snapshot
    cadence only changes how often a cache row is written, and the content cap, watcher
    bounds and poll interval bound one process's own calls and memory."""
    agreed = SharedSettings(backend, SESSION_SETTINGS).agree(
        [
            Shared(
                "session.request_id_window_s", "--request-id-window", limits.request_id_window_s
            ),
            Shared(
                "session.pii_key_id",
                "--pii-key-file or SWITCHBOARD_PII_KEY",
                pii_key_id(pii_key),
                adoptable=False,
            ),
        ],
        policy,
    )
    return replace(limits, request_id_window_s=float(agreed["session.request_id_window_s"]))


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
        schema cannot be used, `pii.PiiKeyRefused` for a key too short,
        `switchboard.shared_settings.SettingsDisagree` when the shared settings differ
        from the database's (per `database.on_settings_mismatch`)."""
        redactor = pii.Redactor(pii_key)
        if not redactor.keyed:
            log.warning(pii.UNKEYED_WARNING)
        # Erasure leaves no copy of erased content in free pages (see `erasure`).
        database = replace(
            database,
            sqlite_secure_delete=True,
            writer_threads=database.writer_threads or WRITER_THREADS,
        )
        backend = open_backend(database)
        migrations.prepare(backend, SESSION_SCHEMA, migrate_behind=migrate)
        wanted = limits or SessionLimits()
        self.limits = agreed_limits(backend, wanted, pii_key, database.on_settings_mismatch)
        self.requests = RequestStore(
            backend,
            SESSION_REQUESTS,
            self.limits.request_id_window_s,
            fingerprint_key=redactor.fingerprint_key(),
            subject_table=REQUEST_SUBJECTS,  # what erasure finds remembered answers by
        )
        self.core = build_core(backend, database, self.limits, redactor)
        self.store, self.runner = self.core.store, self.core.runner
        self.head = recovery.verify(self.core)
        recovery.fill_summaries(self.core)
        key_migration.announce(self.store)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        self.servicer = SessionServicer(build_parts(self.core), self.requests)
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(self.servicer, server)

    def carry_calls_through(self, chain: InterceptorChain) -> CarriedCalls:
        """CallStream serves the calls it carries through the server's interceptors."""
        self.servicer.carried.serve_through(chain)
        return self.servicer.carried

    def close(self) -> None:
        self.core.watching.close()
        self.runner.close()

    def probe(self) -> None:
        """Raises `Unavailable` unless the database answers now (health checking)."""
        self.runner.probe()

    def gauges(self) -> Iterable[Metric]:
        """Log gauges for Prometheus, read at scrape time."""
        lag_and_head = self.runner.submit_read(
            self.store.projections.head_and_snapshot_lag, consistent=True
        )
        head, lag = lag_and_head.result(timeout=10)
        yield GaugeMetricFamily(
            "switchboard_log_head_sequence", "The newest sequence of the global log.", value=head
        )
        yield GaugeMetricFamily(
            "switchboard_snapshot_lag_events",
            "The most events any session has appended since its latest snapshot.",
            value=lag,
        )
