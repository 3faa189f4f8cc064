"""Continuity: Hermes' freshness cases, suspension, and opt-in time-based resets."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2

from session_service import freshness, records, recovery
from session_service.core import SessionLimits
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, InProcessSession, session_server
from tests.session.conftest import create_agent, resolve, user_message, web
from tests.status import error_details

WAIT_S = 1.3  # just past the 1 s windows these tests configure


def _agent(service: InProcessSession, **settings: object) -> None:
    create_agent(service.stub, settings=pb.AgentSettings(**settings))  # type: ignore[arg-type]


def _window(seconds: int) -> pb.ResumePolicy:
    return pb.ResumePolicy(freshness_window=duration_pb2.Duration(seconds=seconds))


def _interrupted(service: InProcessSession) -> str:
    session_id = resolve(service.stub, **web()).session.session_id
    marked = service.stub.MarkResumable(
        pb.MarkResumableRequest(agent="main", session_id=session_id, pending=True)
    ).session
    assert marked.resume_pending and marked.HasField("resume_marked_time")
    return session_id


def _resumable(service: InProcessSession) -> pb.ListResumableResponse:
    return service.stub.ListResumable(pb.ListResumableRequest(agent="main"))


def _expire(service: InProcessSession, request_id: str = "") -> list[pb.Session]:
    request = pb.ExpireResumableRequest(agent="main", request_id=request_id)
    return list(service.stub.ExpireResumable(request).expired)


def test_a_fresh_mark_resumes_the_same_session(service: InProcessSession) -> None:
    _agent(service)  # the default window: 1 hour
    session_id = _interrupted(service)
    listed = _resumable(service)
    assert [s.session_id for s in listed.sessions] == [session_id]
    again = resolve(service.stub, **web())
    assert (again.session.session_id, again.created) == (session_id, False)
    assert again.session.resume_pending


def test_a_stale_mark_gives_a_new_session(service: InProcessSession) -> None:
    _agent(service, resume=_window(1))
    session_id = _interrupted(service)
    time.sleep(WAIT_S)
    listed = _resumable(service)
    assert list(listed.sessions) == []
    assert [s.session_id for s in listed.stale] == [session_id]
    assert [(s.session_id, s.end_reason) for s in _expire(service)] == [
        (session_id, "resume_pending_expired")
    ]
    assert list(_resumable(service).stale) == [], "expired: no longer interrupted"
    fresh = resolve(service.stub, **web())
    assert fresh.session.session_id != session_id and not fresh.session.resume_pending


def test_routing_a_message_to_a_stale_session_resets_it(service: InProcessSession) -> None:
    _agent(service, resume=_window(1))
    session_id = _interrupted(service)
    time.sleep(WAIT_S)
    routed = resolve(service.stub, **web())
    assert routed.created and routed.session.session_id != session_id
    old = service.stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id))
    assert old.session.end_reason == "resume_pending_expired"


def test_window_zero_disables_the_gate(service: InProcessSession) -> None:
    _agent(service, resume=_window(0))
    session_id = _interrupted(service)
    time.sleep(WAIT_S)
    assert [s.session_id for s in _resumable(service).sessions] == [session_id]
    assert resolve(service.stub, **web()).session.session_id == session_id


def test_never_resume_disables_resuming_and_expiry(service: InProcessSession) -> None:
    _agent(
        service,
        resume=pb.ResumePolicy(never_resume=True, freshness_window=_window(1).freshness_window),
    )
    session_id = _interrupted(service)
    time.sleep(WAIT_S)
    listed = _resumable(service)
    assert list(listed.sessions) == [] and list(listed.stale) == []
    assert _expire(service) == []
    assert resolve(service.stub, **web()).session.session_id == session_id


def test_suspended_sessions_are_never_auto_resumed(service: InProcessSession) -> None:
    _agent(service)
    session_id = _interrupted(service)
    service.stub.SuspendSession(
        pb.SuspendSessionRequest(agent="main", session_id=session_id, suspended=True)
    )
    assert list(_resumable(service).sessions) == []


def test_suspending_twice_moves_the_version_once(service: InProcessSession) -> None:
    _agent(service)
    session_id = resolve(service.stub, **web()).session.session_id
    before = _get(service.stub, session_id).version
    request = pb.SuspendSessionRequest(agent="main", session_id=session_id, suspended=True)
    first = service.stub.SuspendSession(request).session
    retried = service.stub.SuspendSession(request).session  # a client retry
    assert first.suspended and retried.suspended
    assert first.version == retried.version == before + 1


def test_a_turn_taken_over_is_no_fresher(service: InProcessSession) -> None:
    """Another holder taking an interrupted turn over keeps the mark's time, so a turn
    that crashes every gateway that resumes it still expires."""
    _agent(service, resume=_window(1))
    session_id = resolve(service.stub, **web()).session.session_id
    first = _mark(service.stub, session_id, holder="gw-a")
    time.sleep(WAIT_S / 2)
    taken_over = _mark(service.stub, session_id, holder="gw-b")
    assert taken_over.resume_holder == "gw-b"
    assert taken_over.resume_marked_time == first.resume_marked_time
    time.sleep(WAIT_S / 2)
    assert [s.session_id for s in _resumable(service).stale] == [session_id]


def test_an_explicit_reset_wins(service: InProcessSession) -> None:
    _agent(service)
    session_id = _interrupted(service)
    reset = service.stub.ResetSession(
        pb.ResetSessionRequest(agent="main", session_id=session_id, reason="/new")
    )
    assert not reset.session.resume_pending
    assert list(_resumable(service).sessions) == []


def test_no_time_based_reset_by_default(service: InProcessSession) -> None:
    _agent(service)
    session_id = resolve(service.stub, **web()).session.session_id
    time.sleep(WAIT_S)
    assert resolve(service.stub, **web()).session.session_id == session_id


def test_idle_reset_is_opt_in(service: InProcessSession) -> None:
    idle = pb.ResetPolicy(mode=pb.RESET_MODE_IDLE, idle_after=duration_pb2.Duration(seconds=1))
    _agent(service, reset=idle)
    session_id = resolve(service.stub, **web()).session.session_id
    assert resolve(service.stub, **web()).session.session_id == session_id
    time.sleep(WAIT_S)
    routed = resolve(service.stub, **web())
    assert routed.created and routed.session.session_id != session_id
    old = service.stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id))
    assert old.session.end_reason == "idle"


def test_daily_reset_after_the_configured_hour() -> None:
    reset = records.ResetPolicy(mode=records.ResetMode.DAILY, daily_at_hour=4)
    daily = records.AgentSettings(reset=reset)
    now = 1_767_326_400.0  # 2026-01-02 04:00:00 UTC
    session = records.Session(update_time=(int(now) - 60) * 10**9)  # 03:59, before the boundary
    assert freshness.reset_reason(daily, session, now + 1) == "daily"
    session.update_time = (int(now) + 1) * 10**9  # 04:00:01, after it
    assert freshness.reset_reason(daily, session, now + 3600) is None
    assert freshness.reset_reason(records.AgentSettings(), session, now + 86400 * 3) is None


# -- who holds a mark -------------------------------------------------------------------------


def _mark(
    stub: pb_grpc.SessionServiceStub, session_id: str, pending: bool = True, holder: str = ""
) -> pb.Session:
    request = pb.MarkResumableRequest(
        agent="main", session_id=session_id, pending=pending, holder=holder
    )
    return stub.MarkResumable(request).session


def _get(stub: pb_grpc.SessionServiceStub, session_id: str) -> pb.Session:
    return stub.GetSession(pb.GetSessionRequest(agent="main", session_id=session_id)).session


def test_the_holder_travels_with_the_mark(service: InProcessSession) -> None:
    _agent(service)
    session_id = resolve(service.stub, **web()).session.session_id
    assert _mark(service.stub, session_id, holder="gw-a").resume_holder == "gw-a"
    assert _get(service.stub, session_id).resume_holder == "gw-a"
    [listed] = _resumable(service).sessions
    assert (listed.session_id, listed.resume_holder) == (session_id, "gw-a")

    # A later mark (the next turn, another gateway) names its own holder.
    assert _mark(service.stub, session_id, holder="gw-b").resume_holder == "gw-b"
    cleared = _mark(service.stub, session_id, pending=False, holder="gw-b")
    assert (cleared.resume_pending, cleared.resume_holder) == (False, "")
    assert _get(service.stub, session_id).resume_holder == ""
    unknown = _mark(service.stub, session_id)
    assert (unknown.resume_pending, unknown.resume_holder) == (True, "")


@pytest.mark.parametrize(
    "holder", ["../gw", "a/b", "a\\b", "C:gw", "gw\n", "x" * 129], ids=repr
)  # fmt: skip
def test_an_unsafe_holder_is_invalid_and_changes_nothing(
    service: InProcessSession, holder: str
) -> None:
    _agent(service)
    session_id = resolve(service.stub, **web()).session.session_id
    before = _get(service.stub, session_id)
    with pytest.raises(grpc.RpcError) as error:
        _mark(service.stub, session_id, holder=holder)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(error.value)[1] == ["holder"]
    assert _get(service.stub, session_id) == before


def test_the_holder_survives_a_restart_snapshots_and_a_rebuild(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    limits = SessionLimits(snapshot_every=2)  # the mark ends up inside a snapshot
    with session_server(loop_thread, database_url, limits) as before:
        create_agent(before.stub)
        session_id = resolve(before.stub, **web()).session.session_id
        holder = "0123456789abcdef0123456789abcdef"  # a gateway's instance id
        _mark(before.stub, session_id, holder=holder)
        for text in ("one", "two", "three"):  # the turn goes on: versions move, snapshots
            before.stub.AppendEvents(
                pb.AppendEventsRequest(
                    agent="main", session_id=session_id, events=[user_message(text)]
                )
            )
        marked = _get(before.stub, session_id)
    assert marked.resume_holder == holder
    with session_server(loop_thread, database_url, limits) as after:
        assert _get(after.stub, session_id) == marked
        listed = after.stub.ListResumable(pb.ListResumableRequest(agent="main")).sessions
        assert [(s.session_id, s.resume_holder) for s in listed] == [(session_id, holder)]
        store: Any = after.unit.store
        with store.database.connection_context():
            snapshot = store.snapshots.latest_snapshot(
                f"session:{session_id}", records.SessionState
            )
            assert snapshot is not None
            assert snapshot[1].session is not None
            assert snapshot[1].session.resume_holder == holder
            store.snapshots.delete_snapshots()
        report = recovery.rebuild(after.unit.core)
        assert not report.differed, report.differences
        assert _get(after.stub, session_id) == marked, "a replay of the log says the same"


def test_a_rewind_brings_back_the_holder_of_its_target(service: InProcessSession) -> None:
    _agent(service)
    session_id = resolve(service.stub, **web()).session.session_id
    target = _mark(service.stub, session_id, holder="gw-a").last_sequence
    _mark(service.stub, session_id, holder="gw-b")
    service.stub.Rewind(pb.RewindRequest(sequence=target))
    rewound = _get(service.stub, session_id)
    assert (rewound.resume_pending, rewound.resume_holder) == (True, "gw-a")
    assert [s.resume_holder for s in _resumable(service).sessions] == ["gw-a"]


def test_listing_resumable_sessions_writes_nothing(service: InProcessSession) -> None:
    """ListResumable is a read: a stale session it reports stays as it was (its
    version, its routing key), however often it is listed; ExpireResumable resets it."""
    _agent(service, resume=_window(1))
    session_id = _interrupted(service)
    time.sleep(WAIT_S)
    before = _get(service.stub, session_id)
    head = _log_head(service)
    for _ in range(3):
        listed = _resumable(service)
        assert [s.session_id for s in listed.stale] == [session_id]
        assert list(listed.expired) == [], "the deprecated field stays empty"
    assert _get(service.stub, session_id) == before, "listing changed the session"
    assert _log_head(service) == head, "listing logged events"


def _log_head(service: InProcessSession) -> int:
    store: Any = service.unit.store
    with store.database.connection_context():
        return int(store.log.head())


def test_expiring_is_a_write_with_a_request_id(service: InProcessSession) -> None:
    """ExpireResumable resets each stale session once: a retry with the same request id
    answers the first answer, a fresh call finds nothing more to expire."""
    _agent(service, resume=_window(1))
    stale = _interrupted(service)
    fresh_id = resolve(service.stub, **web("tab-2")).session.session_id
    time.sleep(WAIT_S)
    _mark(service.stub, fresh_id)  # marked now: fresh
    first = _expire(service, request_id="expire-1")
    assert [s.session_id for s in first] == [stale]
    assert _expire(service, request_id="expire-1") == first, "a retry answers the same"
    assert _expire(service) == [], "nothing stale is left"
    assert [s.session_id for s in _resumable(service).sessions] == [fresh_id]
    assert _get(service.stub, stale).status == pb.SESSION_STATUS_ENDED


def test_expiring_needs_a_live_agent(service: InProcessSession) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        service.stub.ExpireResumable(pb.ExpireResumableRequest(agent="nobody"))
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as failed:
        service.stub.ExpireResumable(pb.ExpireResumableRequest(agent="Not A Name"))
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
