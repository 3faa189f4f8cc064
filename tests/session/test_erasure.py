"""Erasure (issue 23, server half, item 5): EraseSession and EraseRecords really erase.
Content is looked for byte by byte where it could hide: the SQLite files (main,
-wal, -shm), every row of every table and a pg_dump of the schema on Postgres;
and no later rewind or checkout brings it back. On both backends, through real
servers."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import grpc
import psycopg2
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import POSTGRES_URL, InProcessSession
from tests.session.conftest import create_agent, user_message
from tests.session.frameworks import (
    SESSION,
    USER,
    adk_source,
    decoded,
    delta,
    head,
    open_adk,
    put,
    record,
    refused,
)

#: Distinctive content, one marker per place it is written to.
MARKERS = {
    "message": b"zebra-message-7f3a",
    "answer": b"zebra-answer-91c2",
    "state": b"zebra-state-5d0e",
    "temp": b"zebra-temp-2b8f",
    "payload": b"zebra-payload-c4e1",
    "metadata": b"zebra-metadata-0a9d",
    "label": b"zebra-label-6e3b",
    "conversation": b"zebra-conversation-88aa",
    "inbox": b"zebra-inbox-41f0",
}


def _texts(name: str) -> str:
    return MARKERS[name].decode()


def _sqlite_copies(database_url: str) -> dict[str, list[str]]:
    """Which markers each SQLite file holds (as text or anywhere in its bytes)."""
    path = Path(database_url.removeprefix("sqlite:///"))
    found: dict[str, list[str]] = {}
    for suffix in ("", "-wal", "-shm"):
        file = Path(f"{path}{suffix}")
        data = file.read_bytes() if file.exists() else b""
        found[file.name] = sorted(name for name, marker in MARKERS.items() if marker in data)
    return found


def _postgres_schema(database_url: str) -> str:
    options = unquote(urlparse(database_url).query).removeprefix("options=")
    return options.removeprefix("-csearch_path=")


def _postgres_copies(database_url: str) -> dict[str, list[str]]:
    """Which markers the live rows of every table of the schema hold, and a pg_dump of
    the schema (text, and bytea written as hex)."""
    schema = _postgres_schema(database_url)
    hexes = {name: marker.hex().encode() for name, marker in MARKERS.items()}

    def markers_in(data: bytes) -> list[str]:
        return sorted(
            name for name, marker in MARKERS.items() if marker in data or hexes[name] in data
        )

    found: dict[str, list[str]] = {}
    connection = psycopg2.connect(POSTGRES_URL)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
            for (table,) in cursor.fetchall():
                cursor.execute(f'SELECT t::text FROM "{schema}"."{table}" t')
                rows = "\n".join(row[0] for row in cursor.fetchall()).encode()
                found[table] = markers_in(rows)
    finally:
        connection.close()
    url = urlparse(POSTGRES_URL)
    dumped = subprocess.run(
        ["pg_dump", "-h", url.hostname or "127.0.0.1", "-p", str(url.port or 5432),
         "-U", url.username or "postgres", "-n", schema, url.path.lstrip("/")],
        capture_output=True, check=True, timeout=60, env={**os.environ, "PGCONNECT_TIMEOUT": "5"},
    )  # fmt: skip
    found["pg_dump"] = markers_in(dumped.stdout)
    return found


def _copies(database_url: str) -> set[str]:
    found = (
        _sqlite_copies(database_url)
        if database_url.startswith("sqlite")
        else _postgres_copies(database_url)
    )
    return {marker for markers in found.values() for marker in markers}


def _filled_session(service: InProcessSession) -> tuple[pb.Session, int]:
    """A session holding every marker: history, a request id's remembered answer,
    scoped and temp state, records, a retraction, an inbox post; snapshotted. Returns
    it and the sequence of its last event."""
    stub = service.stub
    session = open_adk(stub, "alice", _texts("conversation"))
    sid = session.session_id
    temp = pb.SessionEventInput(
        temp_state_changed=pb.TempStateChanged(set={"note": _texts("temp")})
    )
    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="main", session_id=sid, events=[user_message(_texts("message")), temp],
            state_deltas=[delta(SESSION, note=_texts("state"))],
        )
    )  # fmt: skip
    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="main", session_id=sid, events=[user_message(_texts("answer"))],
            request_id="erase-me-1",
        )
    )  # fmt: skip
    stub.RetractMessages(pb.RetractMessagesRequest(agent="main", session_id=sid, newest_count=1))
    put(
        stub,
        sid,
        record(
            "c1",
            payload=MARKERS["payload"],
            metadata=json.dumps({"note": _texts("metadata")}),
            labels={"run_id": _texts("label")},
        ),
    )
    stub.PostToInbox(
        pb.PostToInboxRequest(
            agent="main",
            session_id=sid,
            message=pb.Message(role=pb.ROLE_USER, content=_texts("inbox"), message_ref="m1"),
        )
    )
    stub.SnapshotSession(pb.SnapshotSessionRequest(agent="main", session_id=sid))
    return session, head(stub)


def test_an_erased_session_leaves_no_copy_and_no_rewind_or_checkout_brings_it_back(
    service: InProcessSession, database_url: str
) -> None:
    stub = service.stub
    create_agent(stub)
    stub.CreateCheckpoint(pb.CreateCheckpointRequest(label="before-everything"))
    stub.UpdateState(
        pb.UpdateStateRequest(agent="main", deltas=[delta(USER, user_id="alice", lang="fr")])
    )
    session, last = _filled_session(service)
    assert _copies(database_url) == set(MARKERS), "the scan finds what is there"

    erased = stub.EraseSession(pb.EraseSessionRequest(agent="main", session_id=session.session_id))

    assert erased.erased_events > 0 and erased.erasure.erasure.whole_session
    assert _copies(database_url) == set()
    missing = pb.GetSessionRequest(agent="main", session_id=session.session_id)
    refused(lambda: stub.GetSession(missing), grpc.StatusCode.NOT_FOUND)
    retried = pb.AppendEventsRequest(
        agent="main", session_id=session.session_id, events=[user_message(_texts("answer"))],
        request_id="erase-me-1",
    )  # fmt: skip
    refused(lambda: stub.AppendEvents(retried), grpc.StatusCode.NOT_FOUND)  # answer forgotten
    for move in (
        lambda: stub.Checkout(pb.CheckoutRequest(sequence=last)),
        lambda: stub.Rewind(pb.RewindRequest(checkpoint="before-everything")),
        lambda: stub.Checkout(pb.CheckoutRequest(sequence=last)),
    ):
        move()
        refused(lambda: stub.GetSession(missing), grpc.StatusCode.NOT_FOUND)
        history = pb.GetHistoryRequest(agent="main", session_id=session.session_id)
        refused(lambda: stub.GetHistory(history), grpc.StatusCode.NOT_FOUND)  # noqa: B023
        lookup = pb.ResolveSessionRequest(
            agent="main", source=adk_source("alice", _texts("conversation")), lookup_only=True
        )
        refused(lambda: stub.ResolveSession(lookup), grpc.StatusCode.NOT_FOUND)  # noqa: B023
    assert _copies(database_url) == set()
    user = stub.GetUserState(pb.GetUserStateRequest(agent="main", user_id="alice"))
    assert decoded(user.state) == {"lang": "fr"}, "the user's state is not the session's"
    tombstones = list(
        stub.ListLogEvents(
            pb.ListLogEventsRequest(session_id=session.session_id, page_size=1000)
        ).entries
    )
    assert tombstones and {e.event.WhichOneof("body") for e in tombstones} == {"erased"}
    sequences = [entry.event.sequence for entry in stub.ListLogEvents(
        pb.ListLogEventsRequest(page_size=1000)).entries]  # fmt: skip
    assert sequences == list(range(1, head(stub) + 1)), "the global sequence keeps no gaps"


def test_an_erased_session_is_not_resolved_or_spawned_again_unless_asked(
    service: InProcessSession,
) -> None:
    stub = service.stub
    create_agent(stub)
    session = open_adk(stub, "alice", "s-1")
    spawned = stub.SpawnSession(pb.SpawnSessionRequest(agent="main", session_id="main.nightly"))
    old_version = spawned.session.version
    stub.AppendEvents(
        pb.AppendEventsRequest(
            agent="main", session_id="main.nightly", events=[user_message("x")] * 3
        )
    )
    for sid in (session.session_id, "main.nightly"):
        stub.EraseSession(pb.EraseSessionRequest(agent="main", session_id=sid))
    before = head(stub)

    resolve = pb.ResolveSessionRequest(agent="main", source=adk_source("alice", "s-1"))
    erased = grpc.StatusCode.FAILED_PRECONDITION
    refused(lambda: stub.ResolveSession(resolve), erased, "SESSION_ERASED")
    spawn = pb.SpawnSessionRequest(agent="main", session_id="main.nightly")
    refused(lambda: stub.SpawnSession(spawn), erased, "SESSION_ERASED")
    assert head(stub) == before
    reopened = stub.ResolveSession(
        pb.ResolveSessionRequest(
            agent="main", source=adk_source("alice", "s-1"), reopen_erased=True
        )
    )
    assert reopened.created and reopened.session.session_id != session.session_id
    again = stub.SpawnSession(
        pb.SpawnSessionRequest(agent="main", session_id="main.nightly", reopen_erased=True)
    ).session
    assert again.version > old_version + 3, "versions never repeat, erased ones included"
    history = pb.GetHistoryRequest(agent="main", session_id="main.nightly")
    assert not stub.GetHistory(history).messages


def _thread(service: InProcessSession, name: str) -> str:
    source = pb.Source(transport="langgraph", conversation_id=name)
    request = pb.ResolveSessionRequest(agent="main", source=source)
    return service.stub.ResolveSession(request).session.session_id


def _keys(service: InProcessSession, session_id: str, kind: str = "checkpoint") -> list[str]:
    listed = service.stub.ListRecords(
        pb.ListRecordsRequest(agent="main", session_id=session_id, kind=kind)
    )
    return [item.key for item in listed.records]


def _erase(service: InProcessSession, **fields: Any) -> pb.EraseRecordsResponse:
    return service.stub.EraseRecords(pb.EraseRecordsRequest(agent="main", **fields))


def test_erasing_records_by_key_takes_their_children_and_leaves_the_rest_of_their_puts(
    service: InProcessSession, database_url: str
) -> None:
    create_agent(service.stub)
    thread = _thread(service, "t1")
    put(
        service.stub, thread,
        record("c1", payload=MARKERS["payload"]), record("c2"),
        record("c1/w", kind="writes", parent_key="c1", payload=MARKERS["inbox"]),
    )  # fmt: skip

    erased = _erase(
        service, session_id=thread, kind="checkpoint", keys=["c1"], children_kind="writes"
    )

    assert erased.erased_records == 2 and list(erased.session_ids) == [thread]
    assert _keys(service, thread) == ["c2"] and _keys(service, thread, "writes") == []
    got = service.stub.GetRecord(
        pb.GetRecordRequest(agent="main", session_id=thread, kind="checkpoint", key="c2")
    )
    assert got.record.payload == b"c2", "the put's other record is intact"
    assert not {"payload", "inbox"} & _copies(database_url)
    written = head(service.stub)
    nothing = _erase(service, session_id=thread, kind="checkpoint", keys=["c1"])
    assert (nothing.erased_records, nothing.HasField("erasure")) == (0, False)
    assert head(service.stub) == written


def test_erasing_reaches_puts_a_rewind_abandoned_so_no_checkout_restores_them(
    service: InProcessSession, database_url: str
) -> None:
    create_agent(service.stub)
    thread = _thread(service, "t1")
    kept = put(service.stub, thread, record("c1"))
    put(service.stub, thread, record("c2", payload=MARKERS["payload"]))
    tip = head(service.stub)
    service.stub.Rewind(pb.RewindRequest(sequence=kept.sequence))
    assert _keys(service, thread) == ["c1"]

    erased = _erase(service, session_id=thread, kind="checkpoint", all=True)

    assert erased.erased_records == 2
    service.stub.Checkout(pb.CheckoutRequest(sequence=tip))
    assert _keys(service, thread) == []
    assert "payload" not in _copies(database_url)


def test_erasing_by_labels_spans_the_agents_sessions_and_keep_newest_prunes_per_namespace(
    service: InProcessSession,
) -> None:
    create_agent(service.stub)
    one, two = _thread(service, "t1"), _thread(service, "t2")
    for thread in (one, two):
        put(service.stub, thread, record("a", labels={"run_id": "r1"}))
        put(service.stub, thread, record("b", labels={"run_id": "r2"}))
        put(service.stub, thread, record("c", labels={"run_id": "r3"}))
        put(service.stub, thread, record("n1", namespace="child"))
        put(service.stub, thread, record("n2", namespace="child"))
    runs = [pb.RecordLabelFilter(name="run_id", values=["r1", "r2"])]

    erased = _erase(service, kind="checkpoint", labels=runs)

    assert erased.erased_records == 4 and sorted(erased.session_ids) == sorted([one, two])
    assert _keys(service, one) == _keys(service, two) == ["n2", "n1", "c"]
    _erase(service, session_id=one, kind="checkpoint", keep_newest_per_namespace=1)
    assert _keys(service, one) == ["n2", "c"]
    events = service.stub.ListLogEvents(pb.ListLogEventsRequest(event_types=["erasure"]))
    assert [e.event.erasure.erased_records for e in events.entries] == [4, 1]


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "checkpoint"},  # no selection
        {"kind": "checkpoint", "all": True, "keys": ["a"]},  # two
        {"kind": "Bad", "all": True},
        {"kind": "checkpoint", "all": True, "session_id": ""},  # agent-wide needs labels
    ],
)
def test_a_bad_record_erasure_is_refused_and_writes_nothing(
    service: InProcessSession, fields: dict[str, Any]
) -> None:
    create_agent(service.stub)
    thread = _thread(service, "t1")
    put(service.stub, thread, record("a"))
    before = head(service.stub)
    request = {"session_id": thread, **fields}
    refused(lambda: _erase(service, **request), grpc.StatusCode.INVALID_ARGUMENT)
    assert head(service.stub) == before and _keys(service, thread) == ["a"]
