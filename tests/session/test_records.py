"""The core's plain records and the one mapper to and from the protos (issue 13 item 6).

Samples are built from the proto descriptors, every field set: a field or `Event.body`
kind added to the proto without a record field or mapping fails here, not in
production. Stored rows keep format 1 byte for byte, and only the servicer and the
mappers may import the generated session module.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from session_service import convert, records, storage_format
from switchboard.session.v1 import session_service_pb2 as pb

_SESSION_SERVICE = Path(__file__).parents[2] / "session_service"
#: The modules that may see generated session messages: the gRPC face, the mappers,
#: and the app that registers the servicer.
_MAY_IMPORT_PB = {"servicer.py", "convert.py", "storage_format.py", "app.py"}
_BODY = pb.Event.DESCRIPTOR.oneofs_by_name["body"]


def _scalar(field: Any, salt: int) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-{salt}"
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type == FieldDescriptor.TYPE_BYTES:
        return f"{field.name}-{salt}".encode()
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


# -- stored rows ----------------------------------------------------------------------------


def _same_bytes(written: bytes, stored: bytes, kind: type[ProtoMessage]) -> bool:
    """The same bytes; where a map's entries may come in another order (protobuf's own
    encoding does not fix it), the same bytes once the entries are sorted."""
    if written == stored:
        return True
    again, before = kind.FromString(written), kind.FromString(stored)
    return len(written) == len(stored) and again.SerializeToString(
        deterministic=True
    ) == before.SerializeToString(deterministic=True)


#: An event as the protobuf-era code logged it (format 1): `pb.Event.SerializeToString`.
_LOGGED_BEFORE = bytes.fromhex(
    "0805120461676e741a05736573733120032a0b08c0d498a90610959aef3a"
    "b201170a150801120b6869207468657265e280a61a0475736572"
)


def test_format_1_rows_written_before_decode_to_the_same_records() -> None:
    written = pb.Event.FromString(_LOGGED_BEFORE)

    record = storage_format.decode_event(1, _LOGGED_BEFORE)

    assert record == convert.event(written)
    assert isinstance(record.body, records.MessageAppended)
    assert record.body.message is not None and record.body.message.content == "hi there…"
    assert storage_format.encode_event(record) == _LOGGED_BEFORE


@pytest.mark.parametrize("body", _KINDS)
def test_log_rows_keep_their_bytes(body: Any) -> None:
    for event in (_event(body), _event(body, empty_messages=True)):
        stored = event.SerializeToString()

        record = storage_format.decode_event(1, stored)

        assert record == convert.event(event)
        assert _same_bytes(storage_format.encode_event(record), stored, pb.Event)


@pytest.mark.parametrize("kind", [pb.SessionState, pb.Agent], ids=lambda kind: kind.__name__)
def test_snapshot_rows_keep_their_bytes(kind: type[ProtoMessage]) -> None:
    stored = _filled(kind()).SerializeToString()
    record_kind = getattr(records, kind.__name__)

    record = storage_format.decode_state(record_kind, 1, stored)

    assert isinstance(record, record_kind)
    assert _same_bytes(storage_format.encode_state(record), stored, kind)


def test_summaries_keep_their_deterministic_bytes() -> None:
    session = _filled(pb.Session())
    agent = _filled(pb.Agent())
    assert isinstance(session, pb.Session) and isinstance(agent, pb.Agent)
    agent.ClearField("memory")

    for message, decode in (
        (session, storage_format.decode_session_summary),
        (agent, storage_format.decode_agent_summary),
    ):
        stored = message.SerializeToString(deterministic=True)
        record = decode(stored)
        assert storage_format.encode_summary(record) == stored


# -- the boundary ---------------------------------------------------------------------------


def _imports_session_pb(source: str) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            if any(alias.name.endswith("session_service_pb2") for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.endswith("session_service_pb2") or any(
                alias.name == "session_service_pb2" for alias in node.names
            ):
                return True
    return False


def test_only_the_servicer_and_the_mappers_import_the_generated_messages() -> None:
    importing = {
        path.name
        for path in _SESSION_SERVICE.glob("*.py")
        if _imports_session_pb(path.read_text(encoding="utf-8"))
    }

    assert importing - _MAY_IMPORT_PB == set()


def test_the_guard_sees_every_way_of_importing_them() -> None:
    for source in (
        "from switchboard.session.v1 import session_service_pb2 as pb",
        "import switchboard.session.v1.session_service_pb2",
        "from switchboard.session.v1.session_service_pb2 import Event",
        "def late():\n    from switchboard.session.v1 import session_service_pb2\n",
    ):
        assert _imports_session_pb(source), source
    assert not _imports_session_pb("from switchboard.session.v1 import session_service_pb2_grpc")
