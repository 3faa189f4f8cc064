"""Conversions between epoch seconds and protobuf time types."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2


def timestamp(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    if seconds is None:
        return None
    value = timestamp_pb2.Timestamp()
    value.FromNanoseconds(round(seconds * 1e9))
    return value


def duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(round(seconds * 1e9))
    return value
