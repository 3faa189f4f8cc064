"""SIGKILL each service at random moments under load from several client threads.

After every kill the service is restarted and checked against what its clients
were told: every acknowledged append or ledger change is there, the session
log is exactly 1..head with each append logged once, the projections and
snapshots equal a replay of the log, and a SQLite file passes
`PRAGMA integrity_check`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from delivery_service.records import NewObligation
from session_service import convert, records, recovery, replay
from session_service.app import SessionUnit
from session_service.storage.event_log import session_entity
from switchboard.database import DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.chaos.common import (
    DEADLINE,
    ROUNDS,
    Processes,
    assert_gap_free,
    channel_to,
    is_sqlite,
    join_all,
    seeded,
    session_log,
    sqlite_integrity,
    wait_for,
)
from tests.harness import ServerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

WRITERS = 4
CALL_TIMEOUT_S = 10.0
#: Every instance is one bot's: its claimers take over the rows of its killed writers.
GATEWAY = "chaos-gateway"


def _kill_after_random_load(
    server: ServerProcess, rng: random.Random, acks: Callable[[], int]
) -> None:
    """Lets the load run a random while (at least a few acknowledged calls), then SIGKILLs."""
    start = acks()
    wait_for(lambda: acks() - start >= 5, 30, "the first acknowledged calls")
    time.sleep(rng.uniform(0.05, 0.8))
    server.kill()


# == SessionService ===========================================================================


@dataclass
class Acked:
    """One acknowledged log event: where the server said it is and what it carries."""

    sequence: int
    kind: str
    session_id: str
    token: str  # unique text in the event ("" for resume marks)


@dataclass
class SessionLoad:
    acked: list[Acked] = field(default_factory=list)
    #: Per writer, every acknowledged sequence in the order the writer got them.
    sequences: dict[int, list[int]] = field(default_factory=dict)
    #: Tokens of calls sent but never answered (one call per writer and kill): each
    #: may be logged once or not at all.
    unanswered: set[str] = field(default_factory=set)
    #: Unanswered tokens a check found logged (committed just before the kill).
    committed_unanswered: set[str] = field(default_factory=set)
    #: Sessions written since the last check.
    sessions: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self) -> int:
        return len(self.acked)


def _message(token: str) -> spb.Message:
    return spb.Message(role=spb.ROLE_USER, content=token)


def _session_writer(
    stub: spb_grpc.SessionServiceStub,
    load: SessionLoad,
    writer: int,
    round_no: int,
    session_id: str,
    rng: random.Random,
    stop: threading.Event,
) -> str:
    """Mixed session traffic until the server dies or `stop`; returns its current session."""
    seen = load.sequences.setdefault(writer, [])
    n = 0
    pending = False
    while not stop.is_set() and n < 100_000:
        n += 1
        base = f"tok-{round_no}-{writer}-{n}"
        choice = rng.random()
        try:
            if choice < 0.6:
                tokens = [f"{base}-{i}" for i in range(rng.randint(1, 3))]
                load.unanswered.update(tokens)
                events = stub.AppendEvents(
                    spb.AppendEventsRequest(
                        agent="main",
                        session_id=session_id,
                        events=[
                            spb.SessionEventInput(
                                message_appended=spb.MessageAppended(message=_message(t))
                            )
                            for t in tokens
                        ],
                    ),
                    timeout=CALL_TIMEOUT_S,
                ).events
                done = [
                    Acked(e.sequence, "message_appended", session_id, t)
                    for e, t in zip(events, tokens, strict=True)
                ]
            elif choice < 0.8:
                load.unanswered.add(base)
                event = stub.PostToInbox(
                    spb.PostToInboxRequest(
                        agent="main", session_id=session_id, message=_message(base)
                    ),
                    timeout=CALL_TIMEOUT_S,
                ).event
                done = [Acked(event.sequence, "inbox_posted", session_id, base)]
            elif choice < 0.9:
                load.unanswered.add(base)
                resolved = stub.ResolveSession(
                    spb.ResolveSessionRequest(
                        agent="main", source=spb.Source(transport="web", conversation_id=base)
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
                assert resolved.created, "a fresh routing key resolved to an existing session"
                session_id = resolved.session.session_id
                done = [Acked(resolved.session.create_sequence, "session_opened", session_id, base)]
            else:
                pending = not pending
                session = stub.MarkResumable(
                    spb.MarkResumableRequest(agent="main", session_id=session_id, pending=pending),
                    timeout=CALL_TIMEOUT_S,
                ).session
                done = [Acked(session.last_sequence, "resume_marked", session_id, "")]
        except grpc.RpcError:
            return session_id  # the server died under us: that call was never acknowledged
        with load.lock:
            load.acked.extend(done)
            load.unanswered.difference_update(a.token for a in done)
            load.sessions.update(a.session_id for a in done)
        seen.extend(a.sequence for a in done)
    return session_id


def _run_writer(
    stub: spb_grpc.SessionServiceStub,
    load: SessionLoad,
    writer: int,
    round_no: int,
    current: list[str],
    rng: random.Random,
    stop: threading.Event,
) -> None:
    current[writer] = _session_writer(stub, load, writer, round_no, current[writer], rng, stop)


def _check_session_log(url: str, address: str, load: SessionLoad, watch_after: int) -> int:
    """The log against what the writers were told, read from the table (all of it)
    and through WatchEvents after `watch_after` on the restarted server."""
    head, events = session_log(url)
    assert_gap_free(head, events)
    by_sequence = {event.sequence: event for event in events}
    for acked in load.acked:
        event = by_sequence.get(acked.sequence)
        assert event is not None, f"acknowledged sequence {acked.sequence} is not logged"
        assert (event.WhichOneof("body"), event.session_id) == (acked.kind, acked.session_id)
        if acked.kind == "message_appended":
            assert event.message_appended.message.content == acked.token
        elif acked.kind == "inbox_posted":
            assert event.inbox_posted.message.content == acked.token
        elif acked.kind == "session_opened":
            assert event.session_opened.source.conversation_id == acked.token
    for writer, sequences in load.sequences.items():
        assert sequences == sorted(set(sequences)), f"writer {writer}: sequences not increasing"
    tokens: Counter[str] = Counter()
    for event in events:
        body = event.WhichOneof("body")
        if body == "message_appended":
            tokens[event.message_appended.message.content] += 1
        elif body == "inbox_posted":
            tokens[event.inbox_posted.message.content] += 1
        elif body == "session_opened" and event.session_opened.source.conversation_id:
            tokens[event.session_opened.source.conversation_id] += 1
    duplicated = [token for token, count in tokens.items() if count > 1]
    assert not duplicated, f"logged more than once: {duplicated[:10]}"
    acked_tokens = {a.token for a in load.acked if a.token}
    unexplained = set(tokens) - acked_tokens - load.unanswered - load.committed_unanswered
    assert not unexplained, (
        f"logged but never sent (or sent and lost, then logged later): {sorted(unexplained)[:10]}"
    )

    with channel_to(address) as channel:
        stub = spb_grpc.SessionServiceStub(channel)
        stream = stub.WatchEvents(spb.WatchEventsRequest(after_sequence=watch_after), timeout=120)
        watched: list[spb.Event] = []
        try:
            for response in stream:
                watched.append(response.event)
                if response.event.sequence >= head:
                    break
        finally:
            stream.cancel()
        assert watched == events[watch_after:], f"WatchEvents from {watch_after} != the table"
    # A call the kill cut off either committed before it or never will.
    found = {token for token in load.unanswered if token in tokens}
    load.committed_unanswered |= found
    load.unanswered.clear()
    return len(found)


def _check_replay(url: str, address: str, sessions: set[str]) -> None:
    """Projections, snapshots and served state all equal a replay of the log."""
    unit = SessionUnit(DatabaseSettings(url=url))  # verifies head == newest event on open
    try:
        report = recovery.rebuild(unit.core)
        assert not report.differed, f"the projections differed from a replay: {report}"
        with channel_to(address) as channel:
            stub = spb_grpc.SessionServiceStub(channel)
            for session_id in sorted(sessions):
                with unit.store.database.connection_context():
                    replayed = records.SessionState()
                    for event in unit.store.log.entity_events(session_entity(session_id), 0):
                        replay.apply_to_session(replayed, event)
                    cached = unit.store.states.session_state(session_id)
                assert cached == replayed, f"snapshot + tail of {session_id} differs from a replay"
                served = stub.GetSessionState(
                    spb.GetSessionStateRequest(agent="main", session_id=session_id),
                    timeout=CALL_TIMEOUT_S,
                ).state
                assert served == convert.to_pb(replayed), (
                    f"served state of {session_id} differs from a replay"
                )
    finally:
        unit.close()


def test_sigkill_session_service_under_load(database_url: str, processes: Processes) -> None:
    rng = seeded("session kills")
    extra = ("--snapshot-every", "7")  # snapshots are written often, so kills hit them too
    server = processes.server(database_url, *extra, service="session")
    load = SessionLoad()
    with channel_to(server.address) as channel:
        stub = spb_grpc.SessionServiceStub(channel)
        stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")), timeout=10)
        current = []
        for i in range(WRITERS):
            session = stub.ResolveSession(
                spb.ResolveSessionRequest(
                    agent="main", source=spb.Source(transport="web", conversation_id=f"tab-{i}")
                ),
                timeout=10,
            ).session
            current.append(session.session_id)
            load.acked.append(
                Acked(session.create_sequence, "session_opened", session.session_id, f"tab-{i}")
            )
    load.sessions.update(current)
    in_flight_logged = 0
    checked_head = 0
    for round_no in range(ROUNDS):
        last = round_no == ROUNDS - 1
        load.sessions = set(current)
        stop = threading.Event()
        with channel_to(server.address) as channel:
            stub = spb_grpc.SessionServiceStub(channel)

            threads = [
                threading.Thread(
                    target=_run_writer,
                    args=(
                        stub,
                        load,
                        w,
                        round_no,
                        current,
                        random.Random(rng.randrange(2**32)),
                        stop,
                    ),
                    name=f"writer-{w}",
                )
                for w in range(WRITERS)
            ]
            for thread in threads:
                thread.start()
            try:
                _kill_after_random_load(server, rng, load.count)
            finally:
                stop.set()
                join_all(threads)
        server = processes.server(database_url, *extra, service="session")
        # Each round checks the whole table, and the log and states this round
        # changed through the server; the last round streams from 0 and replays
        # every session.
        watch_after = 0 if last else checked_head
        in_flight_logged += _check_session_log(database_url, server.address, load, watch_after)
        checked_head, logged = session_log(database_url)
        every_session = {e.session_id for e in logged if e.HasField("session_opened")}
        _check_replay(database_url, server.address, every_session if last else load.sessions)
        if is_sqlite(database_url):
            assert sqlite_integrity(database_url) == "ok"
    print(
        f"session kills: {ROUNDS} rounds, {len(load.acked)} acknowledged events, "
        f"{in_flight_logged} unanswered calls found committed, 0 lost, 0 duplicated"
    )


# == DeliveryService ==========================================================================

_STAGE = {
    dpb.OBLIGATION_STATE_PENDING: 0,
    dpb.OBLIGATION_STATE_ATTEMPTING: 1,
    dpb.OBLIGATION_STATE_FAILED: 2,
    dpb.OBLIGATION_STATE_DELIVERED: 3,
    dpb.OBLIGATION_STATE_ABANDONED: 3,
}
MAX_ATTEMPTS = 3


def _rank(row: dpb.Obligation) -> tuple[int, int]:
    """How far a row has come: each fence, then each step within it."""
    return (row.fence, _STAGE[row.state])


@dataclass
class InFlight:
    """A call sent but never answered: what it may have done if it committed."""

    kind: str  # "record", "attempting", "delivered", "failed", "claim"
    instance_id: str
    obligation_id: str = ""
    target: int = 0  # an ObligationState for a holder transition


@dataclass
class LedgerLoad:
    #: Every acknowledged version of each row (the newest is the highest rank).
    acked: dict[str, list[dpb.Obligation]] = field(default_factory=dict)
    unanswered: list[InFlight] = field(default_factory=list)
    instances: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0

    def ack(self, *rows: dpb.Obligation) -> None:
        with self.lock:
            for row in rows:
                self.acked.setdefault(row.id, []).append(row)
            self.count += 1


def _ledger_gateway(
    stub: dpb_grpc.DeliveryServiceStub,
    load: LedgerLoad,
    tag: str,
    rng: random.Random,
    stop: threading.Event,
) -> None:
    """A gateway's send path: record → (attempting) → delivered or failed, until the kill."""
    try:
        instance_id = stub.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name=GATEWAY, host=tag, platforms=["slack"]),
            timeout=CALL_TIMEOUT_S,
        ).instance.instance_id
    except grpc.RpcError:
        return
    with load.lock:
        load.instances.append(instance_id)
    for n in range(100_000):
        if stop.is_set():
            return
        new = NewObligation(
            session_key=f"agent:main:slack:dm:{tag}",
            message_ref=f"{tag}-{n}",
            content=f"reply {tag}-{n}",
            platform="slack",
            chat_id=tag,
        )
        call = InFlight("record", instance_id, new.id)
        try:
            row = stub.RecordObligation(
                dpb.RecordObligationRequest(
                    instance_id=instance_id,
                    session_key=new.session_key,
                    message_ref=new.message_ref,
                    content=new.content,
                    platform=new.platform,
                    chat_id=new.chat_id,
                    begin_attempt=rng.random() < 0.5,
                ),
                timeout=CALL_TIMEOUT_S,
            ).obligation
            load.ack(row)
            if row.state == dpb.OBLIGATION_STATE_PENDING and rng.random() < 0.8:
                call = InFlight("attempting", instance_id, row.id, dpb.OBLIGATION_STATE_ATTEMPTING)
                row = stub.MarkAttempting(
                    dpb.MarkAttemptingRequest(
                        obligation_id=row.id, instance_id=instance_id, fence=row.fence
                    ),
                    timeout=CALL_TIMEOUT_S,
                ).obligation
                load.ack(row)
            outcome = rng.random()
            if outcome < 0.15:
                continue  # left owed: the next round's claimer gets it
            holder: dict[str, Any] = {
                "obligation_id": row.id,
                "instance_id": instance_id,
                "fence": row.fence,
            }
            if outcome < 0.3:
                retryable = rng.random() < 0.8
                target = (
                    dpb.OBLIGATION_STATE_FAILED if retryable else dpb.OBLIGATION_STATE_ABANDONED
                )
                call = InFlight("failed", instance_id, row.id, target)
                row = stub.MarkFailed(
                    dpb.MarkFailedRequest(error="503", retryable=retryable, **holder),
                    timeout=CALL_TIMEOUT_S,
                ).obligation
            else:
                call = InFlight("delivered", instance_id, row.id, dpb.OBLIGATION_STATE_DELIVERED)
                row = stub.MarkDelivered(
                    dpb.MarkDeliveredRequest(platform_message_id=f"pm-{n}", **holder),
                    timeout=CALL_TIMEOUT_S,
                ).obligation
            load.ack(row)
        except grpc.RpcError:
            with load.lock:
                load.unanswered.append(call)
            return


def _ledger_claimer(
    stub: dpb_grpc.DeliveryServiceStub, load: LedgerLoad, stop: threading.Event
) -> None:
    """Claims orphans of earlier rounds (and due retries) and delivers them."""
    try:
        instance_id = stub.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name=GATEWAY, host="claimer", platforms=["slack"]),
            timeout=CALL_TIMEOUT_S,
        ).instance.instance_id
    except grpc.RpcError:
        return
    with load.lock:
        load.instances.append(instance_id)
    call = InFlight("claim", instance_id)
    try:
        while not stop.is_set():
            call = InFlight("claim", instance_id)
            claimed = stub.ClaimRecoverable(
                dpb.ClaimRecoverableRequest(instance_id=instance_id, limit=10),
                timeout=CALL_TIMEOUT_S,
            ).obligations
            load.ack(*claimed)
            for row in claimed:
                call = InFlight("delivered", instance_id, row.id, dpb.OBLIGATION_STATE_DELIVERED)
                delivered = stub.MarkDelivered(
                    dpb.MarkDeliveredRequest(
                        obligation_id=row.id, instance_id=instance_id, fence=row.fence
                    ),
                    timeout=CALL_TIMEOUT_S,
                ).obligation
                load.ack(delivered)
            if not claimed:
                time.sleep(0.02)
    except grpc.RpcError:
        with load.lock:
            load.unanswered.append(call)


def _all_rows(stub: dpb_grpc.DeliveryServiceStub) -> dict[str, dpb.Obligation]:
    rows: dict[str, dpb.Obligation] = {}
    request = dpb.ListObligationsRequest(page_size=1000)
    while True:
        page = stub.ListObligations(request, timeout=30)
        rows.update((row.id, row) for row in page.obligations)
        if not page.next_page_token:
            return rows
        request.page_token = page.next_page_token


def _explained_by(stored: dpb.Obligation, newest: dpb.Obligation, calls: list[InFlight]) -> bool:
    """Whether a row beyond its newest acknowledged version is what an unanswered call did."""
    for call in calls:
        holder_call = call.kind in ("attempting", "delivered", "failed")
        if (
            holder_call
            and call.obligation_id == stored.id
            and (stored.state, stored.fence, stored.owner_instance_id)
            == (call.target, newest.fence, call.instance_id)
        ):
            return True
        if call.kind == "claim" and (
            stored.owner_instance_id == call.instance_id
            and stored.state == dpb.OBLIGATION_STATE_ATTEMPTING
            and stored.fence == newest.fence + 1
            and stored.attempts == newest.attempts + 1
        ):
            return True
    # The sweep inside any claim abandons a recoverable row that used up its attempts.
    return (
        stored.state == dpb.OBLIGATION_STATE_ABANDONED
        and stored.fence == newest.fence
        and stored.attempts >= MAX_ATTEMPTS
    )


def _check_ledger(stub: dpb_grpc.DeliveryServiceStub, load: LedgerLoad) -> dict[str, int]:
    rows = _all_rows(stub)
    figures = {"committed_unanswered": 0}
    for row_id, versions in load.acked.items():
        stored = rows.get(row_id)
        assert stored is not None, f"acknowledged obligation {row_id} is gone"
        newest = max(versions, key=_rank)
        assert (stored.content, stored.session_key) == (newest.content, newest.session_key)
        assert _rank(stored) >= _rank(newest), (
            f"{row_id} went back: acknowledged {newest}, stored {stored}"
        )
        if _rank(stored) == _rank(newest):
            assert (stored.state, stored.owner_instance_id, stored.attempts) == (
                newest.state,
                newest.owner_instance_id,
                newest.attempts,
            ), f"{row_id}: stored {stored} is not the acknowledged {newest}"
        else:
            assert _explained_by(stored, newest, load.unanswered), (
                f"{row_id}: stored {stored} is beyond the acknowledged {newest}, "
                f"and no unanswered call explains it ({load.unanswered})"
            )
            figures["committed_unanswered"] += 1
    never_acked = set(rows) - set(load.acked)
    recorded_unanswered = {c.obligation_id for c in load.unanswered if c.kind == "record"}
    assert never_acked <= recorded_unanswered, f"rows nobody recorded: {never_acked}"
    figures["committed_unanswered"] += len(never_acked)
    for row_id in never_acked:  # a record that committed but was never answered
        load.acked[row_id] = [rows[row_id]]
    for row in rows.values():
        if row.id in load.acked and _rank(row) > max(map(_rank, load.acked[row.id])):
            load.acked[row.id].append(row)  # the committed outcome is now known
    stats = stub.GetLedgerStats(dpb.GetLedgerStatsRequest(), timeout=CALL_TIMEOUT_S)
    assert sum(c.count for c in stats.state_counts) == len(rows)
    return figures


def test_sigkill_delivery_service_under_load(database_url: str, processes: Processes) -> None:
    rng = seeded("delivery kills")
    # Failed rows are due at once, so the claimer races the gateways over them.
    extra = ("--backoff", "0", "--max-attempts", str(MAX_ATTEMPTS))
    server = processes.server(database_url, *extra)
    load = LedgerLoad()
    committed_unanswered = 0
    for round_no in range(ROUNDS):
        stop = threading.Event()
        load.unanswered = []
        with channel_to(server.address) as channel:
            stub = dpb_grpc.DeliveryServiceStub(channel)
            threads = [
                threading.Thread(
                    target=_ledger_gateway,
                    args=(
                        stub,
                        load,
                        f"r{round_no}g{g}",
                        random.Random(rng.randrange(2**32)),
                        stop,
                    ),
                )
                for g in range(WRITERS - 1)
            ]
            threads.append(threading.Thread(target=_ledger_claimer, args=(stub, load, stop)))
            for thread in threads:
                thread.start()
            try:
                _kill_after_random_load(server, rng, lambda: load.count)
            finally:
                stop.set()
                join_all(threads)
        server = processes.server(database_url, *extra)
        with channel_to(server.address) as channel:
            stub = dpb_grpc.DeliveryServiceStub(channel)
            committed_unanswered += _check_ledger(stub, load)["committed_unanswered"]
            # The killed round's gateways are gone: their owed rows become orphans,
            # and each acknowledged registration must still be there to deregister.
            for instance_id in load.instances:
                stub.DeregisterInstance(
                    dpb.DeregisterInstanceRequest(instance_id=instance_id), timeout=CALL_TIMEOUT_S
                )
            load.instances = []
        if is_sqlite(database_url):
            assert sqlite_integrity(database_url) == "ok"

    with channel_to(server.address) as channel:
        stub = dpb_grpc.DeliveryServiceStub(channel)
        drainer = stub.RegisterInstance(
            dpb.RegisterInstanceRequest(gateway_name=GATEWAY, host="drainer", platforms=["slack"]),
            timeout=10,
        ).instance.instance_id

        def drained() -> bool:
            claimed = stub.ClaimRecoverable(
                dpb.ClaimRecoverableRequest(instance_id=drainer, limit=1000), timeout=30
            ).obligations
            for row in claimed:
                stub.MarkDelivered(
                    dpb.MarkDeliveredRequest(
                        obligation_id=row.id, instance_id=drainer, fence=row.fence
                    ),
                    timeout=CALL_TIMEOUT_S,
                )
            return not claimed

        wait_for(drained, 60, "the drainer to claim every orphan")
        rows = _all_rows(stub)
    states = Counter(dpb.ObligationState.Name(row.state) for row in rows.values())
    owed = {row.id for row in rows.values() if _STAGE[row.state] < 3}
    assert not owed, f"rows still owed after the drain: {sorted(owed)[:10]}"
    assert set(rows) == set(load.acked)
    print(
        f"delivery kills: {ROUNDS} rounds, {len(rows)} rows {dict(states)}, "
        f"{committed_unanswered} unanswered calls found committed, 0 lost"
    )
