"""Wires the DeliveryService together: database → store → ledger → servicer."""

from __future__ import annotations

import grpc

from delivery_service.ledger import Ledger
from delivery_service.servicer import DeliveryServicer
from delivery_service.state_machine import LedgerLimits
from delivery_service.store import LedgerStore
from switchboard.database import DatabaseSettings, TransactionRunner, open_backend
from switchboard.delivery.v1 import delivery_service_pb2, delivery_service_pb2_grpc

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
