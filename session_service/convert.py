"""The one mapper between the `switchboard.session.v1` messages and `records`.

Driven by the descriptors: for each record class, the message of the same name
gives its fields, and two functions are generated from them once at import, one
each way, as a person would write them (`print(_source(records.Session))` shows
them): to a record, one constructor call reading every field; to a message, one
constructor call given only the fields that differ from their defaults (setting
a field in a message costs more than testing it here; `ListFields` to read only
the set ones cost more than reading them all). What each field kind becomes is
said in `records`. The servicer and `storage_format` convert through it; the core
calls only its helpers on records (`encoded_size`, `is_valid_mask`,
`merge_masked`), so it never sees a generated message.
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

#: The record classes mapped, each to the message of its name (with what they carry).
_MAPPED: tuple[type[Any], ...] = (
    records.Agent, records.Session, records.SessionState, records.Checkpoint,
    *records.EVENT_BODIES, records.Event,
)  # fmt: skip

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


def _nanos(value: Any) -> int:
    return int(value.seconds * _NANOS + value.nanos)


def _time(kind: type[Any], nanos: int) -> Any:
    seconds, rest = divmod(nanos, _NANOS)
    return kind(seconds=seconds, nanos=rest)


def _enum_of(enum: type[records.OpenEnum]) -> Callable[[int], records.OpenEnum]:
    """number -> member, a dict lookup (calling the enum class costs far more)."""
    members = {int(member): member for member in enum}

    def of(number: int) -> records.OpenEnum:
        found = members.get(number)
        return found if found is not None else enum(number)

    return of


# Field descriptors are typed Any below: their stubs make every message_type optional.


def _reading(field: Any, env: dict[str, Any]) -> str:
    """The expression of a field's record value from message `m` (in `to_record`),
    adding what it calls to `env`."""
    name, ref = field.name, f"field_{field.name}"  # apart from the helpers' names
    # An empty list or map is tested before it is copied: copying costs far more.
    each = f"(v_{name} := m.{name})"
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return f"(dict(v_{name}.items()) if {each} else {{}})"
    if field.type == FieldDescriptor.TYPE_ENUM:
        env[ref] = _enum_of(getattr(records, field.enum_type.name))
        if field.is_repeated:
            return f"([{ref}(x) for x in v_{name}] if {each} else [])"
        return f"{ref}(m.{name})"
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        return f"(list(v_{name}) if {each} else [])" if field.is_repeated else f"m.{name}"
    full_name = field.message_type.full_name
    present = f"m.HasField({name!r})"
    if full_name in _TIME_TYPES:
        return f"_nanos(m.{name}) if {present} else None"
    if full_name == _FIELD_MASK:
        return f"list(m.{name}.paths) if {present} else None"
    sub = _record_class(field.message_type)
    _plan(sub)
    env[f"{ref}_record"] = _TO_RECORD[sub]
    if field.is_repeated:
        return f"([{ref}_record(x) for x in v_{name}] if {each} else [])"
    return f"{ref}_record(m.{name}) if {present} else None"


def _writing(field: Any, env: dict[str, Any]) -> str:
    """The lines of `to_pb` that put a record's field `r.<name>` into `values`, when
    it is not the default (a message: when set), adding what they call to `env`."""
    name, ref = field.name, f"field_{field.name}"  # apart from the helpers' names
    if field.has_presence and field.type != FieldDescriptor.TYPE_MESSAGE:
        raise TypeError(f"{field.full_name}: a scalar with presence; map it by hand")
    value = f"    value = r.{name}\n"
    if field.type != FieldDescriptor.TYPE_MESSAGE or (field.message_type.GetOptions().map_entry):
        return f"{value}    if value:\n        values[{name!r}] = value\n"
    full_name = field.message_type.full_name
    if full_name in _TIME_TYPES:
        env[ref] = _TIME_TYPES[full_name]
        put = f"_time({ref}, value)"
    elif full_name == _FIELD_MASK:
        env[ref] = field_mask_pb2.FieldMask
        put = f"{ref}(paths=value)"
    else:
        sub = _record_class(field.message_type)
        _plan(sub)
        env[ref] = _TO_PB[sub]
        if field.is_repeated:
            return f"{value}    if value:\n        values[{name!r}] = [{ref}(x) for x in value]\n"
        put = f"{ref}(value)"
    return f"{value}    if value is not None:\n        values[{name!r}] = {put}\n"


_SOURCES: dict[type[Any], str] = {}


def _source(kind: type[Any]) -> str:
    """The generated source of a record class's two converters (for reading them)."""
    return _SOURCES[kind]


def _plan(kind: type[Any]) -> None:
    if kind in _TO_RECORD:
        return
    message_class = getattr(pb, kind.__name__)
    descriptor: Any = message_class.DESCRIPTOR
    is_event = kind is records.Event
    in_body = {f.name for f in descriptor.oneofs_by_name["body"].fields} if is_event else set()
    own = [f for f in descriptor.fields if f.name not in in_body]
    unmapped = {f.name for f in fields(kind)} - {f.name for f in own} - {"body"}
    if unmapped:
        raise TypeError(f"records.{kind.__name__} has fields {sorted(unmapped)} the message lacks")
    env: dict[str, Any] = {
        "Record": kind, "Message": message_class, "_nanos": _nanos, "_time": _time,
        "_BODY_TO_RECORD": _BODY_TO_RECORD, "_TO_PB": _TO_PB,
    }  # fmt: skip
    arguments = ", ".join(f"{f.name}={_reading(f, env)}" for f in own)
    if is_event:
        to_record = (
            "def to_record(m):\n"
            "    which = m.WhichOneof('body')\n"
            "    if which is None:\n"
            "        raise ValueError(f'event {m.sequence} has no body')\n"
            f"    return Record(body=_BODY_TO_RECORD[which](getattr(m, which)), {arguments})\n"
        )
    else:
        to_record = f"def to_record(m):\n    return Record({arguments})\n"
    body = "    body = r.body\n    values[body.kind] = _TO_PB[type(body)](body)\n"
    to_pb = (
        "def to_pb(r):\n    values = {}\n"
        + (body if is_event else "")
        + "".join(_writing(f, env) for f in own)
        + "    return Message(**values)\n"
    )
    source = to_record + to_pb
    exec(compile(source, f"<convert {kind.__name__}>", "exec"), env)
    _SOURCES[kind] = source
    _TO_RECORD[kind], _TO_PB[kind] = env["to_record"], env["to_pb"]


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
