"""Stored records (issue 23, server half, item 4): payloads kept once in the log and
read through an index by kind, namespace, key, parent, labels and metadata;
unversioned puts keep the session's version; rewinds and checkouts move them; the
limits a deployment can raise; on both backends, through real servers."""

from __future__ import annotations

import json
from typing import Any

import grpc

from session_service import recovery
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession
from tests.session.conftest import StartSession, create_agent, resolve, web
from tests.session.frameworks import head, put, record, refused, version


def _thread(service: InProcessSession, name: str = "thread-1") -> str:
    source = pb.Source(transport="langgraph", conversation_id=name)
    return service.stub.ResolveSession(
        pb.ResolveSessionRequest(agent="main", source=source)
    ).session.session_id


def _get(service: InProcessSession, session_id: str, **fields: Any) -> pb.GetRecordResponse:
    request = pb.GetRecordRequest(agent="main", session_id=session_id, **fields)
    return service.stub.GetRecord(request)


def _list(service: InProcessSession, **fields: Any) -> pb.ListRecordsResponse:
    return service.stub.ListRecords(pb.ListRecordsRequest(agent="main", **fields))


def _keys(answer: pb.ListRecordsResponse) -> list[str]:
    return [item.key for item in answer.records]


def test_records_put_and_read_back_by_key_newest_and_with_their_children(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    thread = _thread(service)
    before = version(service.stub, thread)
    put(service.stub, thread, record("c1", metadata=json.dumps({"step": 1})))
    put(
        service.stub,
        thread,
        record("c2", parent_key="c1", metadata=json.dumps({"step": 2}), labels={"run_id": "r1"}),
        record("c2/t1/0", kind="writes", parent_key="c2", payload=b"w0"),
        record("c2/t1/1", kind="writes", parent_key="c2", payload=b"w1"),
    )
    put(service.stub, thread, record("c1", namespace="child:1"))

    assert version(service.stub, thread) == before, "unversioned puts keep the version"
    got = _get(service, thread, kind="checkpoint", key="c2", children_kind="writes")
    assert (got.record.payload, got.record.parent_key, dict(got.record.labels)) == (
        b"c2",
        "c1",
        {"run_id": "r1"},
    )
    assert got.record.session_id == thread and got.record.payload_size == 2
    assert [(c.key, c.payload) for c in got.children] == [("c2/t1/0", b"w0"), ("c2/t1/1", b"w1")]
    assert _get(service, thread, kind="checkpoint").record.key == "c2", "the newest put"
    assert _get(service, thread, kind="checkpoint", namespace="child:1").record.key == "c1"
    refused(
        lambda: _get(service, thread, kind="checkpoint", key="c9"),
        grpc.StatusCode.NOT_FOUND,
        "RECORD_NOT_FOUND",
    )
    put(service.stub, thread, record("c1", payload=b"again"))  # a key put again: replaced
    assert _get(service, thread, kind="checkpoint", key="c1").record.payload == b"again"
    assert _get(service, thread, kind="checkpoint").record.key == "c1"


def test_a_listing_filters_by_namespace_labels_metadata_and_pages_newest_first(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    thread, other = _thread(service), _thread(service, "thread-2")
    for step in range(6):
        metadata = json.dumps({"step": step, "source": "loop" if step % 2 else "input"})
        labels = {"run_id": f"r{step // 3}"}
        put(service.stub, thread, record(f"c{step}", metadata=metadata, labels=labels))
    put(service.stub, thread, record("x", namespace="child:1"))
    put(service.stub, other, record("o1", labels={"run_id": "r0"}))

    every = _list(service, session_id=thread, kind="checkpoint")
    assert _keys(every) == ["x", "c5", "c4", "c3", "c2", "c1", "c0"]
    assert not every.records[0].payload and every.records[0].payload_size == 1
    root = _list(service, session_id=thread, kind="checkpoint", namespace="")
    assert _keys(root) == ["c5", "c4", "c3", "c2", "c1", "c0"]
    loops = _list(
        service, session_id=thread, kind="checkpoint", metadata_filter={"source": '"loop"'}
    )
    assert _keys(loops) == ["c5", "c3", "c1"]
    two = _list(service, session_id=thread, kind="checkpoint", metadata_filter={"step": "2.0"})
    assert _keys(two) == ["c2"]
    before = _list(service, session_id=thread, kind="checkpoint", namespace="", before_key="c3")
    assert _keys(before) == ["c2", "c1", "c0"]
    runs = [pb.RecordLabelFilter(name="run_id", values=["r0"])]
    assert _keys(_list(service, kind="checkpoint", labels=runs)) == ["o1", "c2", "c1", "c0"]
    pages, token = [], ""
    while True:
        page = _list(
            service, session_id=thread, kind="checkpoint", page_size=3, page_token=token,
            include_payloads=True,
        )  # fmt: skip
        pages.append([(item.key, item.payload) for item in page.records])
        token = page.next_page_token
        if not token:
            break
    assert [key for page in pages for key, _ in page] == _keys(every)
    assert all(payload == key.encode() for page in pages for key, payload in page)
    refused(
        lambda: _list(service, session_id=thread, kind="checkpoint", before_key="nope"),
        grpc.StatusCode.NOT_FOUND,
        "RECORD_NOT_FOUND",
    )


def test_a_versioned_put_moves_the_version_and_checks_the_expected_one(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    thread = _thread(service)
    start = version(service.stub, thread)

    done = put(service.stub, thread, record("c1"), versioned=True, expected_version=start)
    assert done.version == start + 1 == version(service.stub, thread)
    written = head(service.stub)
    refused(
        lambda: put(service.stub, thread, record("c2"), versioned=True, expected_version=start),
        grpc.StatusCode.ABORTED,
        "VERSION_MISMATCH",
    )
    refused(
        lambda: put(service.stub, thread, record("c2"), expected_version=start + 1),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert head(service.stub) == written


def test_bad_records_are_refused_naming_the_field_and_write_nothing(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    thread = _thread(service)
    before = head(service.stub)
    bad = [
        (record("k", kind="Bad Kind"), "records[0].kind"),
        (record(""), "records[0].key"),
        (record("k", metadata="[1]"), "records[0].metadata"),
        (record("k", metadata="{nope"), "records[0].metadata"),
        (record("k", labels={"bad name": "v"}), "records[0].labels"),
        (record("k", session_id="s"), "records[0]"),
        (record("k\x00"), "records[0].key"),
    ]
    for item, field in bad:
        error = refused(lambda: put(service.stub, thread, item), grpc.StatusCode.INVALID_ARGUMENT)  # noqa: B023
        assert field in (error.details() or ""), (field, error.details())
    refused(lambda: put(service.stub, thread), grpc.StatusCode.INVALID_ARGUMENT)
    assert head(service.stub) == before


def test_payload_limits_per_record_and_per_call_can_be_raised(start_session: StartSession) -> None:
    small = start_session(SessionLimits(max_record_bytes=1000, max_records_call_bytes=1500))
    create_agent(small.stub)
    thread = _thread(small)
    refused(
        lambda: put(small.stub, thread, record("k", payload=b"x" * 1001)),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RECORD_TOO_LARGE",
    )
    two = (record("a", payload=b"x" * 800), record("b", payload=b"x" * 800))
    refused(
        lambda: put(small.stub, thread, *two),
        grpc.StatusCode.INVALID_ARGUMENT,
        "RECORDS_CALL_TOO_LARGE",
    )
    raised = start_session(SessionLimits(max_record_bytes=2 * 1024 * 1024))
    put(raised.stub, thread, record("big", payload=b"y" * (2 * 1024 * 1024)))
    got = _get(raised, thread, kind="checkpoint", key="big")
    assert got.record.payload_size == 2 * 1024 * 1024 == len(got.record.payload)


def test_a_rewind_takes_puts_back_and_a_checkout_restores_them(service: InProcessSession) -> None:
    create_agent(service.stub)
    thread = _thread(service)
    first = put(service.stub, thread, record("c1", payload=b"first"))
    put(service.stub, thread, record("c1", payload=b"second"), record("c2"))
    latest = head(service.stub)

    service.stub.Rewind(pb.RewindRequest(sequence=first.sequence))
    assert _get(service, thread, kind="checkpoint", key="c1").record.payload == b"first"
    assert _keys(_list(service, session_id=thread, kind="checkpoint")) == ["c1"]
    service.stub.Checkout(pb.CheckoutRequest(sequence=latest))
    assert _get(service, thread, kind="checkpoint", key="c1").record.payload == b"second"
    assert _keys(_list(service, session_id=thread, kind="checkpoint")) == ["c2", "c1"]
    report = recovery.rebuild(service.unit.core)
    assert not report.differed, report.differences


def test_records_keep_their_payloads_in_the_log_so_truncation_below_them_is_refused(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    thread = _thread(service)
    put(service.stub, thread, record("c1"))
    service.stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=thread))
    below = head(service.stub) + 1
    resolve(service.stub, **web())  # moves the head on
    refused(
        lambda: service.stub.TruncateLog(pb.TruncateLogRequest(below_sequence=below)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "SNAPSHOT_NEEDED",
    )
    assert _get(service, thread, kind="checkpoint", key="c1").record.payload == b"c1"
