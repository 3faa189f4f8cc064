"""A failed call as one line saying what to do, for every command.

The address options remember, in the click context, which service each command
calls at which address and whether a token was given; when a call fails, the
command group (main.py) asks `explain` for the line it ends with. Where the status
alone cannot tell (nothing listening, or a service of the other kind on that port),
the service's health check, which needs no token, is asked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from switchboard_client import SwitchboardError

#: How long a health probe waits: it only tells a dead port from a live one.
PROBE_TIMEOUT_S = 2.0
_CALLED = "switchboard.called"
_TOKEN_GIVEN = "switchboard.token_given"


@dataclass(frozen=True)
class Service:
    """One of the two services, as a person addresses it."""

    name: str
    grpc_name: str
    usual_port: int
    flag: str
    variable: str

    def how_to_address(self) -> str:
        return f"the {self.name} is usually on :{self.usual_port} ({self.flag} / {self.variable})"


SESSION = Service(
    "SessionService",
    "switchboard.session.v1.SessionService",
    50051,
    "--session",
    "SWITCHBOARD_SESSION_ADDRESS",
)
DELIVERY = Service(
    "DeliveryService",
    "switchboard.delivery.v1.DeliveryService",
    50052,
    "--delivery",
    "SWITCHBOARD_DELIVERY_ADDRESS",
)
SERVICES = (SESSION, DELIVERY)


@dataclass(frozen=True)
class Called:
    service: Service
    address: str


def remember_address(ctx: click.Context, service: Service, address: str) -> None:
    """Called by the address options: the command will call `service` at `address`."""
    called: dict[Service, str] = ctx.meta.setdefault(_CALLED, {})
    called[service] = address


def remember_token(ctx: click.Context, token: str | None) -> None:
    ctx.meta[_TOKEN_GIVEN] = bool(token)


def called_services(ctx: click.Context) -> list[Called]:
    return [Called(service, address) for service, address in ctx.meta.get(_CALLED, {}).items()]


def explain(error: SwitchboardError, ctx: click.Context) -> str:
    """One line: what went wrong and what to do about it."""
    called = called_services(ctx)
    code = error.code
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return _unreachable(error, called)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return _wrong_service(error, called)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return _token_refused(called, given=bool(ctx.meta.get(_TOKEN_GIVEN)))
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return _not_allowed(error)
    return _status(error)


def _status(error: SwitchboardError) -> str:
    reason = f" {error.reason}" if error.reason and error.reason != error.code.name else ""
    return f"{error.code.name}{reason}: {error.message}"


def _who(called: Sequence[Called]) -> str:
    if len(called) == 1:
        return f"the {called[0].service.name} at {called[0].address}"
    return "the services"


def _unreachable(error: SwitchboardError, called: Sequence[Called]) -> str:
    dead = [call for call in called if _answering_services(call.address) is None]
    if not dead:  # it answers: the service itself could not serve the call
        return f"{_status(error)} ({_who(called)} answered but could not serve the call: retry)"
    return "; ".join(
        f"nothing answers at {call.address} (the {call.service.name}): start it with "
        f"`switchboard serve` (or `python3 dev.py serve`), or pass {call.service.flag} "
        f"/ set {call.service.variable}"
        for call in dead
    )


def _wrong_service(error: SwitchboardError, called: Sequence[Called]) -> str:
    found = []
    for call in called:
        there = _answering_services(call.address) or []
        if call.service in there:
            continue
        others = [service for service in there if service is not call.service]
        guess = f"is it the {others[0].name}? " if others else ""
        found.append(
            f"{call.address} answers but is not a {call.service.name}: {guess}"
            f"{call.service.how_to_address()}"
        )
    if found:
        return "; ".join(found)
    return f"{_status(error)} ({_who(called)} runs an older release that lacks this call)"


def _token_refused(called: Sequence[Called], *, given: bool) -> str:
    what = "refused the token" if given else "needs a token"
    return (
        f"{_who(called)} {what} (UNAUTHENTICATED): pass --token or set SWITCHBOARD_TOKEN "
        "to one of the services' --auth-tokens"
    )


#: What each refusal of the services' authorization asks for.
_SCOPES = {
    "ADMIN_ONLY": "an admin token",
    "AGENT_SCOPE": "an admin token, or one whose agents include the agent",
    "GATEWAY_SCOPE": "an admin token, or the gateway's own token",
}


def _not_allowed(error: SwitchboardError) -> str:
    needed = _SCOPES.get(error.reason)
    if needed is None:  # the agent's own permission rules, not the token's scope
        return f"not allowed (PERMISSION_DENIED): {error.message}"
    return (
        f"this token may not do that (PERMISSION_DENIED: {error.message}): use {needed}, "
        "with --token or SWITCHBOARD_TOKEN"
    )


def _answering_services(address: str) -> list[Service] | None:
    """The Switchboard services whose health check answers at `address`; None when
    nothing answers there at all."""
    found: list[Service] = []
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in SERVICES:
            try:
                health.Check(
                    health_pb2.HealthCheckRequest(service=service.grpc_name),
                    timeout=PROBE_TIMEOUT_S,
                )
            except grpc.RpcError as refused:
                if _unreachable_code(refused):
                    return None
                continue  # NOT_FOUND: another service answers there
            found.append(service)
    return found


def _unreachable_code(refused: Any) -> bool:
    code = refused.code() if isinstance(refused, grpc.Call) else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
