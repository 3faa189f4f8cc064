"""How the session log stores what it keeps: a format of its own, versioned per row.

Every log row and snapshot row carries the number of the format its bytes are in
(`session_log.format`, `session_snapshot.format`), and this module is the one place
that turns a row's bytes into the core's records (`session_service.records`) and
back. Format 1 is the protobuf encoding of the
`switchboard.session.v1` messages: `Event` for log rows, `SessionState` or `Agent`
for snapshots, mapped to records by `session_service.convert`. That package is
frozen by `buf breaking` (fields are only ever added), so format 1 keeps its
meaning for good.

Format 2 is the same encoding; what changed is the meaning of one field: its routing
keys (`SessionOpened.routing_key`, a snapshot's `Session.routing_key`) are in the
injective encoding of `session_service.routing`. A format-1 row's key is in the
joined encoding of the releases before it, and is read upgraded
(`legacy_keys.upgraded_key`, from the stored source), so everything built from the
log (projections, rebuilds, rewinds, checkouts, watchers) sees current keys while
the log stays as it was written.

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

from session_service import convert, legacy_keys, records
from switchboard.errors import FailedPrecondition
from switchboard.session.v1 import session_service_pb2 as pb

#: The format this release writes.
CURRENT = 2
KNOWN = frozenset({1, 2})
#: Routing keys joined with ':' (before the injective encoding).
JOINED_KEYS = 1

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
    event = decode_event_as_written(format_number, payload)
    opened = event.body
    if format_number == JOINED_KEYS and isinstance(opened, records.SessionOpened):
        opened.routing_key = legacy_keys.upgraded_key(
            event.agent, opened.routing_key, opened.source
        )
    return event


def decode_event_as_written(format_number: int, payload: bytes) -> records.Event:
    """A log row's event as its release wrote it, a format-1 key not upgraded (what the
    key migration reads the old keys from)."""
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
    state = convert.to_record(kind, message)
    session = state.session if isinstance(state, records.SessionState) else None
    if format_number == JOINED_KEYS and session is not None:
        session.routing_key = legacy_keys.upgraded_key(
            session.agent, session.routing_key, session.source
        )
    return state


def encode_summary(summary: records.Session | records.Agent) -> bytes:
    """A projection row's summary: deterministic, so that a rebuild writes the same bytes."""
    encoded: bytes = convert.to_pb(summary).SerializeToString(deterministic=True)
    return encoded


def decode_session_summary(data: bytes) -> records.Session:
    return convert.to_record(records.Session, pb.Session.FromString(bytes(data)))


def decode_agent_summary(data: bytes) -> records.Agent:
    return convert.to_record(records.Agent, pb.Agent.FromString(bytes(data)))
