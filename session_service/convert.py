"""The one mapper between the `switchboard.session.v1` messages and `records`.

Driven by the descriptors: for each record class, the message of the same name
gives its fields, and a plan of one small function per field is built once at
import (so a call does no descriptor lookups). What each field kind becomes is
said in `records`. Only the servicer and `storage_format` call this module: the
core never sees a generated message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from session_service import records
from switchboard.session.v1 import session_service_pb2 as pb

R = TypeVar("R")

_NANOS = 1_000_000_000
_TIME_TYPES = {
    timestamp_pb2.Timestamp.DESCRIPTOR.full_name: timestamp_pb2.Timestamp,
    duration_pb2.Duration.DESCRIPTOR.full_name: duration_pb2.Duration,
}
_FIELD_MASK = field_mask_pb2.FieldMask.DESCRIPTOR.full_name

#: The record classes mapped, each to the message of its name.
_MAPPED: tuple[type[Any], ...] = (
    records.RoutingPolicy, records.ResumePolicy, records.ResetPolicy, records.AgentSettings,
    records.PermissionRule, records.Narrowing, records.Agent, records.Lineage, records.Source,
    records.Session, records.ToolCall, records.Message, records.Task, records.QueuedMessage,
    records.SessionState, records.Checkpoint, *records.EVENT_BODIES, records.Event,
)  # fmt: skip

#: Field descriptors are typed Any here: their stubs make every message_type optional.
Getter = Callable[[Any], Any]

#: record class -> its converter from its message, and to it; filled by `_plan`.
_TO_RECORD: dict[type[Any], Callable[[Any], Any]] = {}
_TO_PB: dict[type[Any], Callable[[Any], Any]] = {}
#: `Event.body` oneof field name -> the body's record converter.
_BODY_TO_RECORD: dict[str, Callable[[Any], records.EventBody]] = {}


def _record_class(descriptor: Any) -> type[Any]:
    found = getattr(records, descriptor.name, None)
    if found is None or not is_dataclass(found):
        raise TypeError(f"{descriptor.full_name} has no record class in session_service.records")
    return found  # type: ignore[return-value]


def _enum_class(field: Any) -> type[records.OpenEnum]:
    found: type[records.OpenEnum] = getattr(records, field.enum_type.name)
    return found


def _time_to_record(name: str) -> Getter:
    def get(message: Any) -> int | None:
        if not message.HasField(name):
            return None
        value = getattr(message, name)
        return int(value.seconds * _NANOS + value.nanos)

    return get


def _time_to_pb(kind: type[Any]) -> Getter:
    def put(nanos: int | None) -> Any:
        if nanos is None:
            return None
        seconds, rest = divmod(nanos, _NANOS)
        return kind(seconds=seconds, nanos=rest)

    return put


def _field_to_record(field: Any) -> Getter:
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return lambda message: dict(getattr(message, name))
    repeated = field.is_repeated
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        full_name = field.message_type.full_name
        if full_name in _TIME_TYPES:
            return _time_to_record(name)
        if full_name == _FIELD_MASK:
            return lambda m: list(getattr(m, name).paths) if m.HasField(name) else None
        convert = _record_converter(_record_class(field.message_type))
        if repeated:
            return lambda message: [convert(item) for item in getattr(message, name)]
        return lambda message: convert(getattr(message, name)) if message.HasField(name) else None
    if field.type == FieldDescriptor.TYPE_ENUM:
        enum = _enum_class(field)
        if repeated:
            return lambda message: [enum(item) for item in getattr(message, name)]
        return lambda message: enum(getattr(message, name))
    if repeated:
        return lambda message: list(getattr(message, name))
    return lambda message: getattr(message, name)


def _field_to_pb(field: Any) -> Getter | None:
    """record value -> what the message's constructor takes (None: as given)."""
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return None
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return None  # scalars and enums (an IntEnum is an int), repeated or not
    full_name = field.message_type.full_name
    if full_name in _TIME_TYPES:
        return _time_to_pb(_TIME_TYPES[full_name])
    if full_name == _FIELD_MASK:
        return lambda paths: None if paths is None else field_mask_pb2.FieldMask(paths=paths)
    convert = _pb_converter(_record_class(field.message_type))
    if field.is_repeated:
        return lambda items: [convert(item) for item in items]
    return lambda value: None if value is None else convert(value)


def _record_converter(kind: type[Any]) -> Callable[[Any], Any]:
    return lambda message: _TO_RECORD[kind](message)


def _pb_converter(kind: type[Any]) -> Callable[[Any], Any]:
    return lambda record: _TO_PB[kind](record)


def _plan(kind: type[Any]) -> None:
    message_class = getattr(pb, kind.__name__)
    descriptor: Any = message_class.DESCRIPTOR
    in_body = (
        {f.name for f in descriptor.oneofs_by_name["body"].fields}
        if kind is records.Event
        else set()
    )
    to_record = [(f.name, _field_to_record(f)) for f in descriptor.fields if f.name not in in_body]
    to_pb = [(f.name, _field_to_pb(f)) for f in descriptor.fields if f.name not in in_body]
    unmapped = {f.name for f in fields(kind)} - {name for name, _ in to_record} - {"body"}
    if unmapped:
        raise TypeError(f"records.{kind.__name__} has fields {sorted(unmapped)} the message lacks")

    if kind is records.Event:

        def event_to_record(message: Any) -> Any:
            which = message.WhichOneof("body")
            if which is None:
                raise ValueError(f"event {message.sequence} has no body")
            values = {name: get(message) for name, get in to_record}
            return kind(body=_BODY_TO_RECORD[which](getattr(message, which)), **values)

        def event_to_pb(record: Any) -> Any:
            values = _pb_values(record, to_pb)
            body = record.body
            values[body.kind] = _TO_PB[type(body)](body)
            return message_class(**values)

        _TO_RECORD[kind], _TO_PB[kind] = event_to_record, event_to_pb
        return

    def to_record_value(message: Any) -> Any:
        return kind(**{name: get(message) for name, get in to_record})

    def to_pb_value(record: Any) -> Any:
        return message_class(**_pb_values(record, to_pb))

    _TO_RECORD[kind], _TO_PB[kind] = to_record_value, to_pb_value


def _pb_values(record: Any, plan: Iterable[tuple[str, Getter | None]]) -> dict[str, Any]:
    values = {}
    for name, put in plan:
        value = getattr(record, name)
        if put is not None:
            value = put(value)
            if value is None:
                continue
        values[name] = value
    return values


for _kind in _MAPPED:
    _plan(_kind)
for _body in records.EVENT_BODIES:
    _BODY_TO_RECORD[_body.kind] = _TO_RECORD[_body]


def to_record(kind: type[R], message: ProtoMessage) -> R:
    """The record of `message` (a message of the record class's name)."""
    result: R = _TO_RECORD[kind](message)
    return result


def to_pb(record: Any) -> Any:
    """The message of a record (typed by the caller: `pb.<record's class name>`)."""
    return _TO_PB[type(record)](record)


def event(message: pb.Event) -> records.Event:
    return to_record(records.Event, message)


def event_pb(record: records.Event) -> pb.Event:
    result: pb.Event = _TO_PB[records.Event](record)
    return result


def input_body(message: pb.SessionEventInput) -> records.EventBody | None:
    """An append's input: the body it carries (None: none, which the core refuses)."""
    which = message.WhichOneof("body")
    return None if which is None else _BODY_TO_RECORD[which](getattr(message, which))


def encoded_size(record: Any) -> int:
    """The bytes a record takes in its message's encoding (what the answer and state
    limits count: the same as the protobuf-era `ByteSize()`)."""
    size: int = _TO_PB[type(record)](record).ByteSize()
    return size


def is_valid_mask(kind: type[Any], paths: Iterable[str]) -> bool:
    """Whether every path names a field of the record's message (`FieldMask` rules)."""
    mask = field_mask_pb2.FieldMask(paths=list(paths))
    valid: bool = mask.IsValidForDescriptor(getattr(pb, kind.__name__).DESCRIPTOR)
    return valid


def merge_masked(paths: Iterable[str], source: R, destination: R) -> None:
    """Merges the masked fields of `source` into `destination` (in place), as
    `FieldMask.MergeMessage` with messages and lists replaced, never merged: the
    one definition of an UpdateAgent's change."""
    merged = _TO_PB[type(destination)](destination)
    field_mask_pb2.FieldMask(paths=list(paths)).MergeMessage(
        _TO_PB[type(source)](source),
        merged,
        replace_message_field=True,
        replace_repeated_field=True,
    )
    result = _TO_RECORD[type(destination)](merged)
    for field in fields(result):
        setattr(destination, field.name, getattr(result, field.name))
