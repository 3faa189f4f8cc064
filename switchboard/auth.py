"""Bearer-token authentication and agent scopes, for both services.

Tokens come from configuration as `TOKEN=SCOPE` pairs separated by ";":
`admin` may call anything; `agents:a,b` acts for those agents; `gateway:NAME:a,b`
acts for those agents as the gateway (bot account) NAME, and may register
instances of that gateway only. Operator calls (rewind, truncation, agent
administration, ledger repair) need `admin`. Health checks and reflection carry
no token (kubelet probes cannot send one) and are exempt. With no tokens
configured, authentication is off (the local default).

A call is authenticated from its metadata before its request is received: one
without a valid token is answered UNAUTHENTICATED without reading its message, so
an unauthenticated caller cannot make the server hold or parse a request. Every
malformed credential is UNAUTHENTICATED (never INTERNAL), and refusals are logged
in one short line each, at most `LOG_LINES` per `LOG_PERIOD_S`.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from switchboard import secret_checks
from switchboard.errors import PermissionDenied, Unauthenticated
from switchboard.grpc_errors import WrappingInterceptor, rich_status

# Re-exported: the budget was defined here first.
from switchboard.log_budget import LOG_LINES as LOG_LINES
from switchboard.log_budget import LOG_PERIOD_S as LOG_PERIOD_S
from switchboard.log_budget import LogBudget as LogBudget

EXEMPT_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
#: Methods only an admin token may call.
ADMIN_ONLY = frozenset(
    {
        "ListCheckpoints",  # checkpoints are global: they name points of every agent's log
        "ListLogEvents",  # the global log: every agent's events
        "CreateAgent", "UpdateAgent", "DeleteAgent", "ListAgents", "Rewind", "Checkout",
        "CreateCheckpoint", "TruncateLog", "PruneObligations", "RetryObligation",
        "AbandonObligation",
        "GetLedgerStats", "HandOverObligations",
        "ListInstances",  # every principal's gateway instances
        "RecordOperatorAction",  # the global log's audit trail
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


#: Longest bearer token looked up. Longer ones are refused unread; gRPC itself answers
#: RESOURCE_EXHAUSTED for metadata past its limits (8 KiB soft, 16 KiB hard).
MAX_TOKEN_CHARS = 4096
log = logging.getLogger(__name__)


def unsendable(token: str) -> str | None:
    """Why `token` could never arrive as `authorization: Bearer <token>`, or None."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        return f"a token has 1 to {MAX_TOKEN_CHARS} characters"
    if not (token.isascii() and token.isprintable()) or " " in token:
        return "a token is visible ASCII, without spaces (gRPC sends nothing else)"
    return None


def check_sendable(grants: Mapping[str, Grant]) -> None:
    """Raises ValueError for a configured token no client could send (it would never match)."""
    for position, token in enumerate(grants, start=1):
        problem = unsendable(token)
        if problem is not None:
            raise ValueError(f"auth token {position}: {problem}")


def check_secret(grants: Mapping[str, Grant]) -> None:
    """Raises ValueError for a configured token that is a placeholder or too weak to be
    a secret (`switchboard.secret_checks`): the manifests' placeholder tokens would let
    in anyone who has read them. The message names the token by position and scope,
    never by its value."""
    for position, (token, grant) in enumerate(grants.items(), start=1):
        problem = secret_checks.weakness(token, min_chars=secret_checks.MIN_TOKEN_CHARS)
        if problem is not None:
            raise ValueError(
                f"auth token {position} (scope {grant.principal}) is not a secret: {problem}; "
                f"{secret_checks.MAKE_ONE}"
            )


def _refused(problem: str) -> Unauthenticated:
    return Unauthenticated(
        "UNAUTHENTICATED", f"{problem}: send one 'authorization: Bearer <token>' header"
    )


Metadata = Sequence[tuple[str, str | bytes]]
_CREDENTIAL_KEYS = frozenset({"authorization", "authorization-bin"})


def bearer_token(metadata: Metadata | None) -> str:
    """The token of a call's one `authorization: Bearer <token>` header.

    Raises Unauthenticated saying what is wrong with any other credential: none,
    `authorization-bin`, several headers, another scheme, an empty, overlong or
    non-ASCII token. Nothing here can fail otherwise, whatever bytes were sent.
    """
    headers = [(key, value) for key, value in metadata or () if key in _CREDENTIAL_KEYS]
    if any(key == "authorization-bin" for key, _ in headers):
        raise _refused("binary credentials (authorization-bin) are not accepted")
    if not headers:
        raise _refused("no credentials")
    if len(headers) > 1:
        raise _refused(f"{len(headers)} authorization headers")
    header = headers[0][1]
    scheme, _, token = header.strip(" ").partition(" ") if isinstance(header, str) else ("", "", "")
    if scheme.lower() != "bearer":
        raise _refused("not a Bearer credential")
    problem = unsendable(token.strip(" "))
    if problem is not None:
        raise _refused(f"malformed token ({problem})")
    return token.strip(" ")


class _TokenTable:
    """Grants by a keyed digest of their token: one HMAC and one dict lookup per call.

    No per-token loop of comparisons: the dict compares digests under a key drawn at
    start, which a caller cannot compute, so its timing tells nothing about a token.
    """

    def __init__(self, grants: Mapping[str, Grant]) -> None:
        self._key = secrets.token_bytes(32)
        self._grants = {self._digest(token): grant for token, grant in grants.items()}

    def _digest(self, token: str) -> bytes:
        # surrogateescape: a token read from the environment may hold lone surrogates
        # (check_sendable refuses it at start); presented tokens are ASCII by now.
        return hmac.digest(self._key, token.encode("utf-8", "surrogateescape"), "sha256")

    def get(self, token: str) -> Grant | None:
        return self._grants.get(self._digest(token))

    def __bool__(self) -> bool:
        return bool(self._grants)


class AuthInterceptor(WrappingInterceptor):
    """Authenticates each call from its metadata, before its request is read.

    A call without a valid token gets a handler that answers UNAUTHENTICATED at once
    and never reads the request (a request-streaming handler that does not iterate):
    unauthenticated callers cannot make the server receive or parse a message. Calls
    with a valid token run the method, whose scope checks need the request.
    """

    def __init__(self, grants: Mapping[str, Grant]) -> None:
        super().__init__()
        self.tokens = _TokenTable(grants)
        self.log_budget = LogBudget()

    def _grant(self, metadata: Metadata | None) -> Grant:
        grant = self.tokens.get(bearer_token(metadata))
        if grant is None:
            raise _refused("unknown token")
        return grant

    def principal_of(self, metadata: Metadata | None) -> str:
        """Who a call's metadata authenticates, for the access log: "" with
        authentication off, "-" for a refused credential."""
        if not self.tokens:
            return ""
        try:
            return self._grant(metadata).principal
        except Unauthenticated:
            return "-"

    def handler_for(
        self, details: grpc.HandlerCallDetails, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
        method = details.method
        if not self.tokens or method.startswith(EXEMPT_PREFIXES):
            return handler
        try:
            self._grant(details.invocation_metadata)
        except Unauthenticated as refusal:
            return self._refusing(method, handler, refusal)
        return super().handler_for(details, handler)

    def _refusing(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any], refusal: Unauthenticated
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler for this one call that answers `refusal` without reading the request."""
        status = rich_status(refusal)

        async def refuse(_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            self._log_refusal(method, context, refusal)
            try:
                await context.abort(status.code, status.details, status.trailing_metadata)
            except grpc.aio.AbortError:
                raise
            except Exception:
                # gRPC had ended the call itself (e.g. INTERNAL for an upper-case header
                # name): there is nothing left to send, and nothing worth a traceback.
                log.debug("%s: the call had ended before it was refused", method)

        async def refuse_stream(requests: Any, context: Any) -> AsyncIterator[Any]:
            await refuse(requests, context)
            return
            yield  # an async generator, as response-streaming behaviours are

        serializer = handler.response_serializer
        if handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                refuse_stream, response_serializer=serializer
            )
        return grpc.stream_unary_rpc_method_handler(refuse, response_serializer=serializer)

    def _log_refusal(self, method: str, context: Any, refusal: Unauthenticated) -> None:
        held = self.log_budget.take()
        if held is None:
            return
        # One line, no traceback, nothing the caller sent (the method is a known one).
        note = f" ({held} more refused since, not logged)" if held else ""
        log.warning("refused %s from %s: %s%s", method, context.peer(), refusal.message, note)

    def _authorize(self, method: str, request: Any, context: Any) -> Grant:
        grant = self._grant(context.invocation_metadata())
        if grant.admin:
            return grant
        name = method.rsplit("/", 1)[-1]
        if name in ADMIN_ONLY:
            raise PermissionDenied("ADMIN_ONLY", f"{name} needs an admin token")
        if name == "WatchEvents" and not request.agent:
            raise PermissionDenied(
                "AGENT_SCOPE", "name the agent to watch: this token is scoped to agents"
            )
        if name == "ListSessions" and not request.agent:
            raise PermissionDenied(
                "AGENT_SCOPE",
                "name the agent whose sessions to list: this token is scoped to agents",
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
        async def checked(request: Any, context: Any) -> AsyncIterator[Any]:
            # Each streaming call runs in its own task and context: nothing to reset
            # (resetting in a generator's finally can run in another context).
            _GRANT.set(self._authorize(method, request, context))
            async for response in behavior(request, context):
                yield response

        return checked


class _QuietDecodeErrors(logging.Filter):
    """gRPC logs a traceback quoting the bytes of every header value that is not UTF-8
    (twice per call): a flood of such calls would flood the log. This keeps one short
    line, rate limited, without the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.budget = LogBudget()

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Invalid encoding on"):
            return True
        held = self.budget.take()
        if held is None:
            return False
        note = f" ({held} more since, not logged)" if held else ""
        record.msg, record.args = f"a call sent a header value that is not UTF-8{note}", ()
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_grpc_decode_errors() -> None:
    """Installs `_QuietDecodeErrors` on gRPC's logger, once per process."""
    grpc_log = logging.getLogger("grpc._cython.cygrpc")
    if not any(isinstance(f, _QuietDecodeErrors) for f in grpc_log.filters):
        grpc_log.addFilter(_QuietDecodeErrors())
