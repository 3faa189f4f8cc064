"""Both gateways behind one blocking interface, so that one test runs on each.

`make_gateway(kind, ...)` builds the threaded `Gateway` on blocking clients, or
an `AsyncGateway` on grpc.aio clients running on an event loop of its own
thread (`AsyncGatewayInThread`), with `Gateway`'s methods. Loopback platforms
are handed to the async gateway behind `AsyncLoopbackPlatform`, so its
platform calls are awaited as a real async SDK's are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from switchboard_client import DeliveryClient, SessionClient
from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway
from switchboard_client.gateway import Gateway, Inbound
from switchboard_client.loopback import AsyncLoopbackPlatform, LoopbackPlatform

from tests.harness import EventLoopThread

KINDS = ["threaded", "async"]


class AnyGateway(Protocol):
    """What the tests use of a gateway, either kind."""

    claim_every_s: float

    @property
    def instance_id(self) -> str: ...

    @property
    def deferred(self) -> set[str]: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def handle(self, inbound: Inbound) -> str: ...

    def recover(self, platforms: Sequence[str] | None = None) -> int: ...

    def resume_deferred(self) -> None: ...

    def reconnected(self, platform: str) -> None: ...


class AsyncGatewayInThread:
    """An `AsyncGateway` on its own loop thread, driven with blocking calls."""

    def __init__(
        self,
        name: str,
        agent: str,
        session_address: str,
        delivery_address: str,
        adapters: Sequence[Any],
        callback: Any,
        *,
        token: str | None = None,
        **options: Any,
    ) -> None:
        self._loop = EventLoopThread()

        async def build() -> AsyncGateway:
            # grpc.aio channels belong to the loop they are made on.
            sessions = AsyncSessionClient(session_address, token=token)
            ledger = AsyncDeliveryClient(delivery_address, token=token)
            wrapped = [_async_adapter(adapter) for adapter in adapters]
            return AsyncGateway(name, agent, sessions, ledger, wrapped, callback, **options)

        self.gateway: AsyncGateway = self._loop.run(build())

    @property
    def claim_every_s(self) -> float:
        return self.gateway.claim_every_s

    @claim_every_s.setter
    def claim_every_s(self, value: float) -> None:
        self.gateway.claim_every_s = value

    @property
    def instance_id(self) -> str:
        return self.gateway.instance_id

    @property
    def deferred(self) -> set[str]:
        return self.gateway.deferred

    def start(self) -> None:
        self._loop.run(self.gateway.start())

    def stop(self) -> None:
        """Stops the gateway, closes its channels, ends the loop thread."""
        try:
            self._loop.run(self.gateway.stop())
            self._loop.run(self.gateway.sessions.close())
            self._loop.run(self.gateway.ledger.close())
        finally:
            self._loop.close()

    def handle(self, inbound: Inbound) -> str:
        answer: str = self._loop.run(self.gateway.handle(inbound))
        return answer

    def recover(self, platforms: Sequence[str] | None = None) -> int:
        claimed: int = self._loop.run(self.gateway.recover(platforms))
        return claimed

    def resume_deferred(self) -> None:
        self._loop.run(self.gateway.resume_deferred())

    def reconnected(self, platform: str) -> None:
        self._loop.run(self.gateway.reconnected(platform))


def _async_adapter(adapter: Any) -> Any:
    return AsyncLoopbackPlatform(adapter) if isinstance(adapter, LoopbackPlatform) else adapter


def make_gateway(
    kind: str,
    name: str,
    agent: str,
    addresses: tuple[str, str],
    adapters: Sequence[Any],
    callback: Any,
    *,
    clients: tuple[SessionClient, DeliveryClient] | None = None,
    token: str | None = None,
    **options: Any,
) -> AnyGateway:
    """A gateway of `kind` on the services at `addresses` (session, delivery). The
    threaded one uses `clients` when given, else clients of its own."""
    if kind == "async":
        return AsyncGatewayInThread(
            name, agent, *addresses, adapters, callback, token=token, **options
        )
    if clients is None:
        clients = (
            SessionClient(addresses[0], token=token),
            DeliveryClient(addresses[1], token=token),
        )
    return Gateway(name, agent, *clients, adapters, callback, **options)
