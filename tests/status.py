"""Reading rich gRPC errors (google.rpc.Status details) in tests."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def error_details(error: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo, list[str]]:
    """The ErrorInfo and the BadRequest field names carried by an error."""
    status = rpc_status.from_call(error)
    assert status is not None, f"no rich status on {error!r}"
    info = error_details_pb2.ErrorInfo()
    fields: list[str] = []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            fields += [violation.field for violation in bad_request.field_violations]
    return info, fields


def error_reason(error: grpc.RpcError) -> str:
    return str(error_details(error)[0].reason)
