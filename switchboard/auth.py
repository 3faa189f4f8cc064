"""Bearer-token authentication and agent scopes, for both services.

Tokens come from configuration as `TOKEN=SCOPE` pairs separated by ";":
`admin` may call anything; `agents:a,b` acts for those agents; `gateway:NAME:a,b`
acts for those agents as the gateway (bot account) NAME, and may register
instances of that gateway only. Operator calls (rewind, truncation, agent
administration, ledger repair) need `admin`. Health checks and reflection carry
no token (kubelet probes cannot send one) and are exempt. With no tokens
configured, authentication is off (the local default).
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from switchboard.errors import PermissionDenied, Unauthenticated
from switchboard.grpc_errors import WrappingInterceptor

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
#: Methods only an admin token may call.
ADMIN_ONLY = frozenset(
    {
        "ListCheckpoints",  # checkpoints are global: they name points of every agent's log
        "CreateAgent", "UpdateAgent", "DeleteAgent", "ListAgents", "Rewind", "Checkout",
        "CreateCheckpoint", "TruncateLog", "PruneObligations", "RetryObligation",
        "AbandonObligation",
        "GetLedgerStats", "HandOverObligations",
    }
)  # fmt: skip
#: Request fields that name an agent; every one present must be in the token's scope.
AGENT_FIELDS = ("agent", "to_agent", "name")


@dataclass(frozen=True)
class Grant:
    admin: bool = False
    agents: frozenset[str] = frozenset()
    #: Set for a gateway token: the one gateway name its instances may register under.
    gateway: str = ""

    @property
    def principal(self) -> str:
        """Who the caller is, for scoping request ids and owning instances: the
        grant's scope, never the token (tokens of one scope may do the same, so they
        may share answers; a rotated token keeps its retries). Long scopes are digested."""
        if self.admin:
            return "admin"
        kind = f"gateway:{self.gateway}:" if self.gateway else "agents:"
        scope = kind + ",".join(sorted(self.agents))
        if len(scope) <= 128:
            return scope
        return kind.rstrip(":") + "#" + hashlib.sha256(scope.encode()).hexdigest()

    def may_act_for(self, agent: str) -> bool:
        return self.admin or agent in self.agents


#: The grant of the call being served (None with authentication off).
_GRANT: contextvars.ContextVar[Grant | None] = contextvars.ContextVar(
    "switchboard_grant", default=None
)


def current_grant() -> Grant | None:
    """The caller's grant; None when authentication is off (everything is allowed)."""
    return _GRANT.get()


def current_principal() -> str:
    """The caller's principal ("" with authentication off)."""
    grant = _GRANT.get()
    return "" if grant is None else grant.principal


def parse_tokens(spec: str) -> dict[str, Grant]:
    """`tok1=admin;tok2=agents:main,coder` → grants by token."""
    grants: dict[str, Grant] = {}
    for entry in filter(None, (part.strip() for part in spec.split(";"))):
        token, _, scope = entry.partition("=")
        if not token or not scope:
            raise ValueError(f"auth token entry {entry[:8]}…: use TOKEN=admin or TOKEN=agents:a,b")
        if scope == "admin":
            grants[token] = Grant(admin=True)
        elif scope.startswith("agents:"):
            grants[token] = Grant(agents=_names(scope.removeprefix("agents:")))
        elif scope.startswith("gateway:"):
            gateway, _, agents = scope.removeprefix("gateway:").partition(":")
            if not gateway or not agents:
                raise ValueError(f"gateway scope {scope!r}: use gateway:NAME:a,b")
            grants[token] = Grant(agents=_names(agents), gateway=gateway)
        else:
            raise ValueError(f"unknown scope {scope!r}: use admin, agents:a,b or gateway:NAME:a,b")
    return grants


def _names(listed: str) -> frozenset[str]:
    return frozenset(filter(None, (name.strip() for name in listed.split(","))))


def _agents_named(request: Any) -> set[str]:
    names: set[str] = set()
    for field in AGENT_FIELDS:
        value = getattr(request, field, "")
        if isinstance(value, str):
            names.add(value)
        elif hasattr(value, "name"):  # an Agent message (CreateAgent, UpdateAgent)
            names.add(value.name)
    return names - {""}


class AuthInterceptor(WrappingInterceptor):
    def __init__(self, grants: Mapping[str, Grant]) -> None:
        super().__init__()
        self.grants = dict(grants)

    def _grant(self, context: grpc.aio.ServicerContext[Any, Any]) -> Grant:
        header = dict(context.invocation_metadata() or ()).get("authorization", "")
        scheme, _, token = header.partition(" ") if isinstance(header, str) else ("", "", "")
        token = token.strip() if scheme.lower() == "bearer" else ""
        for known, grant in self.grants.items():
            if token and hmac.compare_digest(token, known):
                return grant
        raise Unauthenticated(
            "UNAUTHENTICATED", "send a valid token as 'authorization: Bearer <token>'"
        )

    def _authorize(self, method: str, request: Any, context: Any) -> Grant:
        grant = self._grant(context)
        if grant.admin:
            return grant
        name = method.rsplit("/", 1)[-1]
        if name in ADMIN_ONLY:
            raise PermissionDenied("ADMIN_ONLY", f"{name} needs an admin token")
        if name == "WatchEvents" and not request.agent:
            raise PermissionDenied(
                "AGENT_SCOPE", "name the agent to watch: this token is scoped to agents"
            )
        outside = sorted(_agents_named(request) - grant.agents)
        if outside:
            raise PermissionDenied(
                "AGENT_SCOPE", f"this token may not act for agent {outside[0]!r}"
            )
        return grant

    def wrap_unary(
        self, method: str, behavior: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        if not self.grants or method.startswith(EXEMPT_PREFIXES):
            return behavior

        async def checked(request: Any, context: Any) -> Any:
            grant = _GRANT.set(self._authorize(method, request, context))
            try:
                return await behavior(request, context)
            finally:
                _GRANT.reset(grant)

        return checked

    def wrap_stream(
        self, method: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        if not self.grants or method.startswith(EXEMPT_PREFIXES):
            return behavior

        async def checked(request: Any, context: Any) -> AsyncIterator[Any]:
            # Each streaming call runs in its own task and context: nothing to reset
            # (resetting in a generator's finally can run in another context).
            _GRANT.set(self._authorize(method, request, context))
            async for response in behavior(request, context):
                yield response

        return checked
