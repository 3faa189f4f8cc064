"""The core's plain records and the one mapper to and from the protos (issue 13 item 6).

Samples are built from the proto descriptors, every field set: a field or `Event.body`
kind added to the proto without a record field or mapping fails here, not in
production. Stored rows keep format 1 byte for byte, and only the servicer and the
mappers may import the generated session module.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from session_service import convert, records
from switchboard.session.v1 import session_service_pb2 as pb

_BODY = pb.Event.DESCRIPTOR.oneofs_by_name["body"]


def _scalar(field: Any, salt: int) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{salt}"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number  # a named, non-default value
    return 7 + salt


def _filled(message: ProtoMessage, salt: int = 0, empty_messages: bool = False) -> ProtoMessage:
    """`message` with every field set to a non-default value (sub-messages filled the
    same way, or left present but empty with `empty_messages`); oneofs are left to
    the caller."""
    descriptor: Any = message.DESCRIPTOR
    for field in descriptor.fields:
        if field.containing_oneof is not None:
            continue
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value[f"key-{salt}"] = f"value-{salt}"
            value[f"other-{salt}"] = ""
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in range(2) if field.is_repeated else [None]:
                target = value.add() if item is not None else value
                if empty_messages:
                    target.SetInParent()
                elif field.message_type.full_name == "google.protobuf.FieldMask":
                    target.paths.extend(["display_name", "settings.redact_pii"])
                elif field.message_type.full_name.startswith("google.protobuf."):
                    target.seconds, target.nanos = 1_700_000_000 + salt, 123_456_789
                else:
                    _filled(target, salt + 1)
        elif field.is_repeated:
            value.extend([_scalar(field, salt), _scalar(field, salt + 1)])
        else:
            setattr(message, field.name, _scalar(field, salt))
    return message


def _event(body: Any, empty_messages: bool = False) -> pb.Event:
    event = _filled(pb.Event(), empty_messages=empty_messages)
    assert isinstance(event, pb.Event)
    _filled(getattr(event, body.name), 1, empty_messages).SetInParent()
    return event


_KINDS = [pytest.param(field, id=field.name) for field in _BODY.fields]
#: Every message the mapper takes, outside events (events carry the rest).
_STATES = [pb.SessionState, pb.Agent, pb.Session, pb.Checkpoint, pb.QueuedMessage]


@pytest.mark.parametrize("empty_messages", [False, True], ids=["filled", "present-but-empty"])
@pytest.mark.parametrize("body", _KINDS)
def test_every_event_kind_round_trips_unchanged(body: Any, empty_messages: bool) -> None:
    event = _event(body, empty_messages)

    record = convert.event(event)
    back = convert.event_pb(record)

    assert type(record.body).__name__ == body.message_type.name
    assert record.body.kind == body.name
    assert back == event
    assert back.SerializeToString(deterministic=True) == event.SerializeToString(deterministic=True)


@pytest.mark.parametrize("empty_messages", [False, True], ids=["filled", "present-but-empty"])
@pytest.mark.parametrize("kind", _STATES, ids=lambda kind: kind.__name__)
def test_every_record_round_trips_unchanged(kind: type[ProtoMessage], empty_messages: bool) -> None:
    message = _filled(kind(), empty_messages=empty_messages)

    record = convert.to_record(getattr(records, kind.__name__), message)

    assert convert.to_pb(record) == message


def test_unset_messages_stay_unset_and_the_record_is_plain() -> None:
    record = convert.event(pb.Event(sequence=3, task_cleared=pb.TaskCleared()))

    assert record == records.Event(sequence=3, body=records.TaskCleared())
    assert (
        convert.event_pb(record).SerializeToString()
        == pb.Event(sequence=3, task_cleared=pb.TaskCleared()).SerializeToString()
    )


def test_every_body_kind_has_a_record_and_only_those() -> None:
    assert {body.kind for body in records.EVENT_BODIES} == {f.name for f in _BODY.fields}
    for body in records.EVENT_BODIES:
        field: Any = pb.Event.DESCRIPTOR.fields_by_name[body.kind]
        assert body.__name__ == field.message_type.name


def test_enums_carry_the_protos_numbers_and_keep_unknown_ones() -> None:
    for enum in (records.Role, records.ChatType, records.SessionStatus, records.ResetMode,
                 records.PermissionEffect, records.LogBranch):  # fmt: skip
        proto = pb.DESCRIPTOR.enum_types_by_name[enum.__name__]
        assert {m.value for m in enum} == {v.number for v in proto.values}
    message = convert.to_record(records.Message, pb.Message(role=99))  # type: ignore[arg-type]
    assert message.role == 99 and message.role not in set(records.Role)
    assert convert.to_pb(message).role == 99
