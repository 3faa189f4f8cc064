"""Typed Python clients for Switchboard's gRPC services."""

from switchboard_client._framework import state_delta, state_values
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.delivery import SERVICE_CONFIG, DeliveryClient
from switchboard_client.errors import SwitchboardError
from switchboard_client.session import SERVICE_CONFIG as SESSION_SERVICE_CONFIG
from switchboard_client.session import EventStream, SessionClient

__all__ = [
    "SERVICE_CONFIG",
    "SESSION_SERVICE_CONFIG",
    "AsyncDeliveryClient",
    "AsyncSessionClient",
    "DeliveryClient",
    "EventStream",
    "SessionClient",
    "SwitchboardError",
    "state_delta",
    "state_values",
]
