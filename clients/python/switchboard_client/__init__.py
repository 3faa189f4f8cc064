"""Typed Python clients for Switchboard's gRPC services."""

from switchboard_client.delivery import SERVICE_CONFIG, DeliveryClient
from switchboard_client.errors import SwitchboardError

__all__ = ["SERVICE_CONFIG", "DeliveryClient", "SwitchboardError"]
