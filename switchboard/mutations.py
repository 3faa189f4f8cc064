"""The servicers' side of request ids: which RPCs write, and how their answer is built.

A servicer declares each RPC that writes with the service's `Mutations`:

    mutation = Mutations(pb.DESCRIPTOR.services_by_name["SessionService"])

    @mutation(lambda event: pb.PostToInboxResponse(event=event))
    async def PostToInbox(self, request, context, guard) -> pb.Event:
        return await self.sessions.post_to_inbox(..., guard=guard)

The handler returns the rule's result; the converter makes it the response.
With a `request_id` in the request, the handler is given the call's
`switchboard.idempotency.RequestGuard` (else None) and hands it to its rule,
which hands it to its first write (`TransactionRunner.write(op, guard)`): that
write runs under the guard, the converter runs inside its transaction, and the
stored bytes answer every retry.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar, cast

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

from switchboard import auth
from switchboard.idempotency import (
    Replayed,
    RequestGuard,
    RequestStore,
    checked_request_id,
)


class HasRequests(Protocol):
    #: Where the servicer's request-id records live.
    requests: RequestStore


S = TypeVar("S", bound=HasRequests)
Req = TypeVar("Req", bound=Message)
R = TypeVar("R")
Resp = TypeVar("Resp", bound=Message)
#: A declared RPC's handler: (servicer, request, context, the call's guard or None).
Handler = Callable[[S, Req, Any, RequestGuard | None], Awaitable[R]]


def fingerprint(request: Message, key: bytes | None = None) -> str:
    """sha256 of the request without its request_id (deterministic encoding);
    HMAC-SHA256 with `key` when given."""
    request_id = getattr(request, "request_id")  # noqa: B009 (a field, typed per message)
    request.ClearField("request_id")
    try:
        encoded = request.SerializeToString(deterministic=True)
    finally:
        setattr(request, "request_id", request_id)  # noqa: B010
    if key is not None:
        return hmac.new(key, encoded, hashlib.sha256).hexdigest()
    return hashlib.sha256(encoded).hexdigest()


class Mutations:
    """Declares the RPCs of one service that write (and so take a request_id)."""

    def __init__(
        self,
        service: ServiceDescriptor,
        subjects: Callable[[Message, Message], list[str]] | None = None,
    ) -> None:
        """`subjects`: what a remembered answer is found by besides its request id
        (from the request and the response; see `RequestStore.subject_table`)."""
        self.service = service
        self.subjects = subjects
        self.declared: set[str] = set()

    def __call__(
        self, to_response: Callable[[Any], Resp]
    ) -> Callable[[Handler[S, Req, Any]], Callable[[S, Req, Any], Awaitable[Resp]]]:
        # `to_response` takes Any: a lambda's parameter cannot be annotated, and mypy
        # cannot infer it from the handler, which comes second.
        def declare(handler: Handler[S, Req, Any]) -> Callable[[S, Req, Any], Awaitable[Resp]]:
            rpc = self.service.methods_by_name[handler.__name__]
            if "request_id" not in rpc.input_type.fields_by_name:
                raise TypeError(f"{rpc.full_name}: its request has no request_id field")
            method = f"/{self.service.full_name}/{rpc.name}"
            response_class = message_factory.GetMessageClass(rpc.output_type)
            self.declared.add(rpc.name)

            @functools.wraps(handler)
            async def handle(servicer: S, request: Req, context: Any) -> Resp:
                request_id: str = getattr(request, "request_id")  # noqa: B009
                if not request_id:
                    return to_response(await handler(servicer, request, context, None))
                checked_request_id(request_id)
                built: list[Resp] = []

                # Runs inside the write's transaction: the answer is stored atomically with it.
                def encode(result: Any) -> bytes:
                    built.append(to_response(result))
                    if self.subjects is not None:
                        guard.subjects = self.subjects(request, built[-1])
                    return built[-1].SerializeToString()

                guard = RequestGuard(
                    servicer.requests,
                    auth.current_principal(),
                    request_id,
                    method,
                    fingerprint(request, servicer.requests.fingerprint_key),
                    encode,
                )
                try:
                    result = await handler(servicer, request, context, guard)
                except Replayed as replayed:
                    return cast(Resp, response_class.FromString(replayed.response))
                # The answer built in the transaction, so first call and replay agree;
                # a rule that answered without writing (a join) built none.
                return built[-1] if built else to_response(result)

            return handle

        return declare
