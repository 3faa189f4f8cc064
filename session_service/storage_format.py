"""How the session log stores what it keeps: a format of its own, versioned per row.

Every log row and snapshot row carries the number of the format its bytes are in
(`session_log.format`, `session_snapshot.format`), and this module is the one place
that turns a row's bytes into the core's records (`session_service.records`) and
back. Format 1, the only one so far, is the protobuf encoding of the
`switchboard.session.v1` messages: `Event` for log rows, `SessionState` or `Agent`
for snapshots, mapped to records by `session_service.convert`. That package is
frozen by `buf breaking` (fields are only ever added), so format 1 keeps its
meaning for good.

Why the number: the public protos can then evolve apart from what is stored. A v2
API, or a storage shape of our own, is a new format number here with its mapper;
rows of both formats are read side by side, and nothing stored is rewritten. A
row whose format this release does not know (written by a newer one) fails loudly,
never as a misread event. Projection summaries (`SessionIndex.summary`) are not in
a format: they are rebuilt from the log (`switchboard session rebuild`); they are
the deterministic protobuf encoding of the `Session`, or the `Agent` without memory.
"""

from __future__ import annotations

from typing import TypeVar

from session_service import convert, records
from switchboard.errors import FailedPrecondition
from switchboard.session.v1 import session_service_pb2 as pb

#: The format this release writes.
CURRENT = 1
KNOWN = frozenset({1})

State = TypeVar("State", records.SessionState, records.Agent)


class UnknownStorageFormat(FailedPrecondition):
    """FAILED_PRECONDITION: the data is fine, this release is too old to read it."""

    def __init__(self, format_number: int) -> None:
        super().__init__(
            "STORAGE_FORMAT_UNKNOWN",
            f"a session log row is in storage format {format_number}, which this release "
            f"does not read (it reads {sorted(KNOWN)}): it was written by a newer release; "
            "run that release, or one that reads the format",
            {"format": str(format_number)},
        )


def _checked(format_number: int) -> None:
    if format_number not in KNOWN:
        raise UnknownStorageFormat(format_number)


def encode_event(event: records.Event) -> bytes:
    """A log row's payload, in format `CURRENT`."""
    return convert.event_pb(event).SerializeToString()


def decode_event(format_number: int, payload: bytes) -> records.Event:
    _checked(format_number)
    return convert.event(pb.Event.FromString(bytes(payload)))


def encode_state(state: records.SessionState | records.Agent) -> bytes:
    """A snapshot row's state, in format `CURRENT`."""
    encoded: bytes = convert.to_pb(state).SerializeToString()
    return encoded


def decode_state(kind: type[State], format_number: int, data: bytes) -> State:
    _checked(format_number)
    message = (pb.SessionState if kind is records.SessionState else pb.Agent).FromString(
        bytes(data)
    )
    return convert.to_record(kind, message)


def encode_summary(summary: records.Session | records.Agent) -> bytes:
    """A projection row's summary: deterministic, so that a rebuild writes the same bytes."""
    encoded: bytes = convert.to_pb(summary).SerializeToString(deterministic=True)
    return encoded


def decode_session_summary(data: bytes) -> records.Session:
    return convert.to_record(records.Session, pb.Session.FromString(bytes(data)))


def decode_agent_summary(data: bytes) -> records.Agent:
    return convert.to_record(records.Agent, pb.Agent.FromString(bytes(data)))
