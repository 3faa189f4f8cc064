"""One exception type for every failed call, with the server's machine-readable details.

The server attaches a `google.rpc.ErrorInfo` (a stable `reason` such as
"STALE_FENCE") and, for INVALID_ARGUMENT, a `google.rpc.BadRequest` naming the
offending fields. Gateway code should branch on `code` and `reason`, never on
the human-readable `message`.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


class SwitchboardError(Exception):
    """A call the server refused or that never completed (deadline, unreachable server)."""

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        field_violations: list[str] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code.name}{f' {reason}' if reason else ''}: {message}")
        self.code = code
        #: Stable, program-facing cause from ErrorInfo; "" when the status has none.
        self.reason = reason
        self.message = message
        #: Request fields named by a BadRequest detail, in the server's order.
        self.field_violations: list[str] = list(field_violations or [])
        #: ErrorInfo metadata (e.g. the row's current "state" on STALE_FENCE).
        self.metadata: dict[str, str] = dict(metadata or {})

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments would otherwise be lost when pickling (e.g. across processes).
        return (
            _rebuild,
            (self.code, self.message, self.reason, self.field_violations, self.metadata),
        )


def _rebuild(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    field_violations: list[str],
    metadata: dict[str, str],
) -> SwitchboardError:
    return SwitchboardError(
        code, message, reason=reason, field_violations=field_violations, metadata=metadata
    )


def from_rpc_error(error: grpc.RpcError) -> SwitchboardError:
    """Converts what a generated stub raised, reading the rich status details if present."""
    if not isinstance(error, grpc.Call | grpc.aio.AioRpcError):
        # Every RpcError raised by a unary call is also a Call (grpc.aio's are
        # AioRpcErrors, with the same accessors); be safe anyway.
        return SwitchboardError(grpc.StatusCode.UNKNOWN, str(error))
    code = error.code()
    message = error.details() or ""
    try:
        status = rpc_status.from_call(error)
    except ValueError:
        # Trailers disagree with the status line: keep the status line, skip the details.
        status = None
    if status is None:
        return SwitchboardError(code, message)
    return from_status(code, message, status)


def from_status(code: grpc.StatusCode, message: str, status: status_pb2.Status) -> SwitchboardError:
    """The error of a google.rpc.Status (its details: ErrorInfo, BadRequest)."""
    reason = ""
    metadata: dict[str, str] = {}
    fields: list[str] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
            metadata = dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            fields += [violation.field for violation in bad_request.field_violations]
    return SwitchboardError(
        code, message, reason=reason, field_violations=fields, metadata=metadata
    )
