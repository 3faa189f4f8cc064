"""Wires the DeliveryService together: database → store → ledger → servicer."""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from delivery_service.ledger import Ledger
from delivery_service.servicer import DeliveryServicer
from delivery_service.state_machine import LedgerLimits
from delivery_service.store import LedgerStore
from switchboard.database import DatabaseSettings, open_backend
from switchboard.delivery.v1 import delivery_service_pb2, delivery_service_pb2_grpc
from switchboard.runner import TransactionRunner

SERVICE_NAME = delivery_service_pb2.DESCRIPTOR.services_by_name["DeliveryService"].full_name


class DeliveryUnit:
    """The DeliveryService with its storage, ready to mount on a server."""

    service_name = SERVICE_NAME

    def __init__(self, database: DatabaseSettings, limits: LedgerLimits | None = None) -> None:
        self.limits = limits or LedgerLimits()
        backend = open_backend(database)
        self.store = LedgerStore(backend, self.limits)
        self.store.create_schema()
        self.runner = TransactionRunner(backend, database)
        self.ledger = Ledger(self.runner, self.store, self.limits)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        delivery_service_pb2_grpc.add_DeliveryServiceServicer_to_server(
            DeliveryServicer(self.ledger), server
        )

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
