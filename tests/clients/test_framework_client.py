"""The Python clients' methods for what agent frameworks store (issue 23): every new
call, blocking and asyncio, against real servers on both backends."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from switchboard_client import SessionClient, state_delta, state_values
from switchboard_client.aio import AsyncSessionClient
from switchboard_client.errors import SwitchboardError

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import InProcessSession

SESSION, USER = pb.STATE_SCOPE_SESSION, pb.STATE_SCOPE_USER


def _said(text: str) -> pb.SessionEventInput:
    message = pb.Message(role=pb.ROLE_USER, content=text)
    return pb.SessionEventInput(message_appended=pb.MessageAppended(message=message))


def test_the_blocking_client_covers_lookups_state_retraction_records_and_erasure(
    session_client: SessionClient,
) -> None:
    client = session_client
    client.create_agent("main")
    with pytest.raises(SwitchboardError) as missing:
        client.resolve(
            "main", transport="adk", conversation_id="s-1", user_id="alice", lookup_only=True
        )
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    session = client.resolve(
        "main", transport="adk", conversation_id="s-1", user_id="alice"
    ).session
    sid = session.session_id
    client.append(
        "main", sid, _said("one"), _said("two"),
        state_deltas=[state_delta(SESSION, {"step": 2}), state_delta(USER, {"lang": "fr"})],
    )  # fmt: skip
    client.update_state("main", [state_delta(USER, {"tz": "CET"}, user_id="alice")])
    got = client.get_session_with_state("main", sid)
    assert state_values(got.scoped_state.session) == {"step": 2}
    assert state_values(client.user_state("main", "alice").state) == {"lang": "fr", "tz": "CET"}
    assert [s.session_id for s in client.list_sessions("main", user_id="alice")] == [sid]

    popped = client.retract_messages("main", sid, newest_count=1)
    assert [m.message.content for m in popped.messages] == ["two"]

    client.put_records(
        "main", sid, [pb.StoredRecord(kind="checkpoint", key="c1", labels={"run_id": "r1"})]
    )
    client.put_records(
        "main", sid,
        [pb.StoredRecord(kind="checkpoint", key="c2", parent_key="c1", metadata='{"step": 2}')],
    )  # fmt: skip
    assert client.get_record("main", sid, "checkpoint").record.key == "c2"
    listed = client.list_records(
        "main", "checkpoint", session_id=sid, metadata_filter={"step": 2}, page_size=1
    )
    assert [record.key for record in listed] == ["c2"]
    by_run = client.list_records("main", "checkpoint", labels={"run_id": ["r1"]})
    assert [record.key for record in by_run] == ["c1"]
    erased = client.erase_records("main", "checkpoint", session_id=sid, keys=["c1"])
    assert erased.erased_records == 1
    assert client.erase_session("main", sid).erased_events > 0
    with pytest.raises(SwitchboardError) as gone:
        client.resolve("main", transport="adk", conversation_id="s-1", user_id="alice")
    assert (gone.value.code, gone.value.reason) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "SESSION_ERASED",
    )
    again = client.resolve(
        "main", transport="adk", conversation_id="s-1", user_id="alice", reopen_erased=True
    )
    assert again.created


def test_the_asyncio_client_covers_the_same_calls(session: InProcessSession) -> None:
    async def run() -> tuple[list[str], list[str], int, bool]:
        async with AsyncSessionClient(session.address) as client:
            await client.create_agent("main")
            opened = await client.resolve("main", transport="langgraph", conversation_id="thread-1")
            sid = opened.session.session_id
            await client.append(
                "main", sid, _said("hi"), state_deltas=[state_delta(SESSION, {"n": 1})]
            )
            await client.update_state("main", [state_delta(SESSION, {"m": 2})], session_id=sid)
            got = await client.get_session_with_state("main", sid)
            await client.retract_messages("main", sid, newest_count=1)
            await client.put_records("main", sid, [pb.StoredRecord(kind="checkpoint", key="c1")])
            record = await client.get_record("main", sid, "checkpoint", key="c1")
            keys = [r.key async for r in client.list_records("main", "checkpoint", session_id=sid)]
            sessions = [s.session_id async for s in client.iter_sessions("main")]
            erased = await client.erase_records(
                "main", "checkpoint", session_id=sid, all_records=True
            )
            spawned = await client.spawn("main", "main.job")
            await client.erase_session("main", spawned.session_id)
            again = await client.spawn("main", "main.job", reopen_erased=True)
            assert record.record.key == "c1" and erased.erased_records == 1
            assert (await client.user_state("main", "nobody")).state == {}
            return sorted(got.scoped_state.session), keys, len(sessions), bool(again.session_id)

    assert asyncio.run(run()) == (["m", "n"], ["c1"], 1, True)
