"""Calls carried over a service's CallStream, and what a call answered, to compare the
carried call with its unary twin: the same response bytes, or the same rich status
(code, message, google.rpc details)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import status_pb2
from grpc_status import rpc_status

#: A call's outcome: ("ok", the response's bytes) or ("error", a google.rpc.Status's bytes).
Outcome = tuple[str, bytes]


def unary_outcome(call: Callable[..., Any], request: Message, **options: Any) -> Outcome:
    """What a unary call answered."""
    try:
        response = call(request, **options)
    except grpc.RpcError as error:
        status = rpc_status.from_call(error)
        if status is None:
            status = status_pb2.Status(code=error.code().value[0], message=error.details())
        return "error", status.SerializeToString()
    return "ok", response.SerializeToString()


def carried_outcome(answer: Any) -> Outcome:
    """What a carried call answered (a CallStreamResponse)."""
    kind = answer.WhichOneof("result")
    if kind == "error":
        return "error", answer.error.SerializeToString()
    return "ok", getattr(answer, kind).SerializeToString()


def status_of(outcome: Outcome) -> status_pb2.Status:
    assert outcome[0] == "error", "the call succeeded"
    return status_pb2.Status.FromString(outcome[1])


def carry(
    call_stream: Callable[..., Any],
    request_class: type[Message],
    calls: Sequence[tuple[str, Message]],
    **options: Any,
) -> list[Any]:
    """Sends `calls` ((oneof field, request) each) over one CallStream and returns the
    answers in the order of `calls` (correlation ids are their positions)."""
    requests = []
    for position, (kind, message) in enumerate(calls):
        request = request_class(correlation_id=position)
        getattr(request, kind).CopyFrom(message)
        requests.append(request)
    answers = {answer.correlation_id: answer for answer in call_stream(iter(requests), **options)}
    assert sorted(answers) == list(range(len(calls))), "every call is answered once"
    return [answers[position] for position in range(len(calls))]


def twins(
    stub: Any, request_class: type[Message], kind: str, request: Message, metadata: Any
) -> tuple[Outcome, Outcome]:
    """The outcome of `request` carried over `stub`'s CallStream as its `kind` field, then
    of the same request sent unary (the RPC named by `kind`)."""
    carried = carry(stub.CallStream, request_class, [(kind, request)], metadata=metadata)
    unary = getattr(stub, "".join(part.title() for part in kind.split("_")))
    return carried_outcome(carried[0]), unary_outcome(unary, request, metadata=metadata)
