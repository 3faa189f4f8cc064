"""Three replicas of each service on one Postgres database (real server processes).

- Appends through all replicas keep one gap-free, commit-ordered sequence: each
  client's acknowledged sequences strictly increase, the log is exactly 1..head,
  and a watcher on one replica sees every sequence in order, with none skipped.
- Concurrent first messages for one routing key, through all replicas, get one session.
- Racing claimers through different replicas claim every orphan exactly once.
- A replica SIGKILLed mid-load loses nothing acknowledged, and its gateways'
  orphans are claimed through the other replicas within the documented bound
  (lease ttl + claim interval); live gateways' rows are never taken.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial

import grpc
import pytest

from delivery_service.app import DeliveryUnit
from delivery_service.records import NewObligation
from session_service import recovery
from session_service.app import SessionUnit
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
    join_all,
    rpc_code,
    seeded,
    session_log,
    sql,
    wait_for,
)
from tests.harness import ServerProcess

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE, pytest.mark.postgres]

REPLICAS = 3
CLIENTS_PER_REPLICA = 2
LEASE_TTL_S = 2.0
CLAIM_INTERVAL_S = 0.5
HEARTBEAT_S = 0.4
#: RPC and scheduling time on a loaded 2-core machine, on top of the documented bound.
SLACK_S = 1.0
TIMEOUT_S = 10.0


@dataclass
class Replica:
    server: ServerProcess
    channel: grpc.Channel

    def close(self) -> None:
        self.channel.close()


class Replicas:
    """Three server processes of one service on one database, with a channel to each."""

    def __init__(self, processes: Processes, url: str, service: str, *extra: str) -> None:
        self.processes, self.url, self.service, self.extra = processes, url, service, extra
        self.replicas = [self._start() for _ in range(REPLICAS)]

    def _start(self) -> Replica:
        server = self.processes.server(self.url, *self.extra, service=self.service)
        return Replica(server, grpc.insecure_channel(server.address))

    def kill(self, index: int) -> None:
        self.replicas[index].server.kill()

    def restart(self, index: int) -> None:
        self.replicas[index].close()
        self.replicas[index] = self._start()

    def channel(self, index: int) -> grpc.Channel:
        return self.replicas[index].channel

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()


@pytest.fixture
def session_replicas(processes: Processes, postgres_url: str) -> Iterator[Replicas]:
    replicas = Replicas(processes, postgres_url, "session")
    yield replicas
    replicas.close()


@pytest.fixture
def delivery_replicas(processes: Processes, postgres_url: str) -> Iterator[Replicas]:
    replicas = Replicas(processes, postgres_url, "delivery", "--lease-ttl", str(LEASE_TTL_S))
    yield replicas
    replicas.close()


# == SessionService ==========================================================================


def _session_stub(replicas: Replicas, index: int) -> spb_grpc.SessionServiceStub:
    return spb_grpc.SessionServiceStub(replicas.channel(index))


def _race_one_routing_key(replicas: Replicas, key: str) -> None:
    """Concurrent first messages for one key, through every replica: one session."""
    start = threading.Barrier(REPLICAS * CLIENTS_PER_REPLICA)
    answers: list[spb.ResolveSessionResponse] = []

    def resolve(index: int) -> None:
        stub = _session_stub(replicas, index % REPLICAS)
        start.wait(timeout=30)
        request = spb.ResolveSessionRequest(
            agent="main", source=spb.Source(transport="web", conversation_id=key)
        )
        answers.append(stub.ResolveSession(request, timeout=TIMEOUT_S))

    threads = [
        threading.Thread(target=resolve, args=(i,)) for i in range(REPLICAS * CLIENTS_PER_REPLICA)
    ]
    for thread in threads:
        thread.start()
    join_all(threads)
    assert len(answers) == len(threads)
    assert len({a.session.session_id for a in answers}) == 1, "one key, several sessions"
    assert sum(a.created for a in answers) == 1


@dataclass
class AppendLoad:
    sequences: dict[int, list[int]] = field(default_factory=dict)
    tokens: dict[int, str] = field(default_factory=dict)  # acknowledged sequence → token
    unanswered: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _appender(
    stub: spb_grpc.SessionServiceStub,
    load: AppendLoad,
    client: int,
    session_id: str,
    prefix: str,
    stop: threading.Event,
) -> None:
    seen = load.sequences.setdefault(client, [])
    for n in range(100_000):
        if stop.is_set():
            return
        tokens = [f"{prefix}-{client}-{n}-{i}" for i in range(1 + n % 2)]
        request = spb.AppendEventsRequest(
            agent="main",
            session_id=session_id,
            events=[
                spb.SessionEventInput(
                    message_appended=spb.MessageAppended(
                        message=spb.Message(role=spb.ROLE_USER, content=token)
                    )
                )
                for token in tokens
            ],
        )
        try:
            events = stub.AppendEvents(request, timeout=TIMEOUT_S).events
        except grpc.RpcError:
            with load.lock:
                load.unanswered.update(tokens)
            return  # its replica died: this client is gone with it
        with load.lock:
            seen.extend(event.sequence for event in events)
            for event, token in zip(events, tokens, strict=True):
                load.tokens[event.sequence] = token


def _watch(
    stub: spb_grpc.SessionServiceStub, after: int, seen: list[int], stop: threading.Event
) -> None:
    stream = stub.WatchEvents(spb.WatchEventsRequest(after_sequence=after), timeout=120)
    stop_watching = threading.Thread(target=lambda: (stop.wait(120), stream.cancel()))
    stop_watching.start()
    try:
        for response in stream:
            seen.append(response.event.sequence)
    except grpc.RpcError as error:
        if rpc_code(error) != grpc.StatusCode.CANCELLED:
            raise
    finally:
        stop.set()
        stop_watching.join(timeout=10)


def _reached(seen: list[int], head: int) -> bool:
    return bool(seen) and seen[-1] >= head


def test_three_session_replicas_keep_one_gap_free_sequence(
    session_replicas: Replicas, postgres_url: str
) -> None:
    rng = seeded("session replicas")
    first = _session_stub(session_replicas, 0)
    first.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")), timeout=TIMEOUT_S)
    clients = REPLICAS * CLIENTS_PER_REPLICA
    sessions = [
        first.ResolveSession(
            spb.ResolveSessionRequest(
                agent="main", source=spb.Source(transport="web", conversation_id=f"tab-{c}")
            ),
            timeout=TIMEOUT_S,
        ).session.session_id
        for c in range(clients)
    ]
    load = AppendLoad()
    acknowledged = 0
    for round_no in range(ROUNDS):
        _race_one_routing_key(session_replicas, f"race-{round_no}")
        victim = rng.randrange(REPLICAS)
        watched_on = (victim + 1 + rng.randrange(REPLICAS - 1)) % REPLICAS
        head_before, _ = session_log(postgres_url)
        stop, watch_stop = threading.Event(), threading.Event()
        seen: list[int] = []
        watcher = threading.Thread(
            target=_watch,
            args=(_session_stub(session_replicas, watched_on), head_before, seen, watch_stop),
        )
        watcher.start()
        threads = [
            threading.Thread(
                target=_appender,
                args=(
                    _session_stub(session_replicas, c % REPLICAS),
                    load,
                    c,
                    sessions[c],
                    f"r{round_no}",
                    stop,
                ),
            )
            for c in range(clients)
        ]
        for thread in threads:
            thread.start()
        try:
            time.sleep(rng.uniform(0.3, 1.0))
            session_replicas.kill(victim)  # mid-load; its clients die with it
            time.sleep(rng.uniform(0.2, 0.6))  # the other replicas carry on
        finally:
            stop.set()
            join_all(threads)
        head, events = session_log(postgres_url)
        try:
            wait_for(partial(_reached, seen, head), 15, "the watcher to reach the head")
        finally:
            watch_stop.set()
            join_all([watcher])

        assert_gap_free(head, events)
        assert seen == list(range(head_before + 1, head + 1)), "the watcher skipped or reordered"
        for client, sequences in load.sequences.items():
            assert sequences == sorted(set(sequences)), f"client {client}: not commit-ordered"
        logged = {
            e.sequence: e.message_appended.message.content
            for e in events
            if e.HasField("message_appended")
        }
        for sequence, token in load.tokens.items():
            assert logged.get(sequence) == token, f"acknowledged {token} at {sequence} is lost"
        counts = Counter(logged.values())
        assert max(counts.values()) == 1, "an append was logged twice"
        assert set(logged.values()) <= set(load.tokens.values()) | load.unanswered
        acknowledged = len(load.tokens)
        session_replicas.restart(victim)

    unit = SessionUnit(DatabaseSettings(url=postgres_url))
    try:
        report = recovery.rebuild(unit.core)
    finally:
        unit.close()
    assert not report.differed, report
    print(f"session replicas: {ROUNDS} rounds, {acknowledged} acknowledged appends, 0 lost")


# == DeliveryService =========================================================================


def _delivery_stub(replicas: Replicas, index: int) -> dpb_grpc.DeliveryServiceStub:
    return dpb_grpc.DeliveryServiceStub(replicas.channel(index))


def _register(stub: dpb_grpc.DeliveryServiceStub, name: str, platform: str = "slack") -> str:
    # One bot's instances (only they claim its rows); the name tells them apart.
    request = dpb.RegisterInstanceRequest(gateway_name="fleet", host=name, platforms=[platform])
    return str(stub.RegisterInstance(request, timeout=TIMEOUT_S).instance.instance_id)


def _seed_orphans(url: str, owner: str, count: int, tag: str) -> set[str]:
    """`count` rows owned by `owner`, for platform `tag` (written through the real store,
    for speed)."""
    # Adopt: the replicas stored their shared settings (--lease-ttl) first.
    unit = DeliveryUnit(DatabaseSettings(url=url, on_settings_mismatch="adopt"))
    store, backend = unit.store, unit.store.backend
    ids = set()
    try:
        with backend.database.connection_context(), backend.write_transaction():
            now = backend.now()
            for i in range(count):
                new = NewObligation(
                    session_key=f"agent:main:slack:dm:{tag}-{i % 37}",
                    message_ref=f"{tag}-{i}",
                    content=f"reply {tag} {i}",
                    platform=tag,
                    chat_id=f"{tag}-{i % 37}",
                )
                assert store.insert_if_live(now, new, owner) is not None
                ids.add(new.id)
    finally:
        unit.close()
    return ids


def _claimer(
    stub: dpb_grpc.DeliveryServiceStub,
    name: str,
    platform: str,
    claimed: dict[str, list[dpb.Obligation]],
    start: threading.Barrier,
    errors: list[BaseException],
    rng: random.Random,
) -> None:
    """Claims batches of random size until three claims in a row come back empty."""
    try:
        me = _register(stub, name, platform)
        mine = claimed.setdefault(me, [])
        start.wait(timeout=30)
        empty = 0
        while empty < 3:
            request = dpb.ClaimRecoverableRequest(instance_id=me, limit=rng.randint(1, 60))
            batch = stub.ClaimRecoverable(request, timeout=30).obligations
            mine.extend(batch)
            empty = 0 if batch else empty + 1
    except BaseException as exc:
        errors.append(exc)


def test_racing_claimers_through_three_replicas_claim_each_orphan_once(
    delivery_replicas: Replicas, postgres_url: str
) -> None:
    rng = seeded("replica claims")
    orphans_per_round = 400
    claimers = REPLICAS * CLIENTS_PER_REPLICA
    overlap = 0
    for round_no in range(ROUNDS):
        # A platform per round: the claimers of earlier rounds never heartbeat, so their
        # rows become orphans again once their leases run out; this round leaves them be.
        crashed = _register(_delivery_stub(delivery_replicas, 0), "crashed", f"r{round_no}")
        orphans = _seed_orphans(postgres_url, crashed, orphans_per_round, f"r{round_no}")
        _delivery_stub(delivery_replicas, 1).DeregisterInstance(
            dpb.DeregisterInstanceRequest(instance_id=crashed), timeout=TIMEOUT_S
        )
        claimed: dict[str, list[dpb.Obligation]] = {}
        start = threading.Barrier(claimers)
        errors: list[BaseException] = []
        threads = [
            threading.Thread(
                target=_claimer,
                args=(
                    _delivery_stub(delivery_replicas, i % REPLICAS),
                    f"claimer-{i}",
                    f"r{round_no}",
                    claimed,
                    start,
                    errors,
                    random.Random(rng.randrange(2**32)),
                ),
            )
            for i in range(claimers)
        ]
        for thread in threads:
            thread.start()
        join_all(threads, timeout_s=120)
        assert not errors, errors
        every = Counter(row.id for rows in claimed.values() for row in rows)
        assert set(every) == orphans, "an orphan was not claimed (or a stranger was)"
        assert max(every.values()) == 1, "a row was claimed twice"
        overlap += sum(1 for rows in claimed.values() if rows) >= 2
        for instance_id, rows in claimed.items():
            for row in rows:
                assert (row.owner_instance_id, row.attempts, row.fence) == (instance_id, 1, 2)
        owners = dict(
            sql(postgres_url, "SELECT id, owner_instance_id FROM ledger_obligation WHERE "
                "state = 'attempting' AND message_ref LIKE ?", [f"r{round_no}-%"])
        )  # fmt: skip
        assert owners == {row.id: i for i, rows in claimed.items() for row in rows}
    assert overlap == ROUNDS, "the claimers never raced"
    print(f"replica claims: {ROUNDS} rounds x {orphans_per_round} orphans, 0 double claims")


@dataclass
class Fleet:
    """Gateways and rescuers spread over the replicas, and what they were told."""

    acked: dict[str, dpb.Obligation] = field(default_factory=dict)
    #: Rows each live gateway holds in flight (a slow send), to mark at the end.
    holding: dict[str, list[dpb.Obligation]] = field(default_factory=dict)
    #: obligation id → (monotonic time, instance) of every claim through a rescuer.
    claims: dict[str, list[tuple[float, str, int]]] = field(default_factory=dict)
    instances_on: dict[int, set[str]] = field(default_factory=dict)
    stale_fences: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, row: dpb.Obligation) -> None:
        with self.lock:
            known = self.acked.get(row.id)
            if known is None or (row.fence, row.state) >= (known.fence, known.state):
                self.acked[row.id] = row

    def joined(self, replica: int, instance_id: str) -> None:
        with self.lock:
            self.instances_on.setdefault(replica, set()).add(instance_id)


def _heartbeats(stub: dpb_grpc.DeliveryServiceStub, me: str, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            stub.Heartbeat(dpb.HeartbeatRequest(instance_id=me, platforms=["slack"]), timeout=5)
        except grpc.RpcError:
            return  # the replica is gone, and so is this gateway


def _gateway(
    stub: dpb_grpc.DeliveryServiceStub,
    replica: int,
    tag: str,
    fleet: Fleet,
    rng: random.Random,
    stop: threading.Event,
) -> None:
    """Records and delivers; keeps some rows in flight (slow sends) until the end."""
    try:
        me = _register(stub, tag)
    except grpc.RpcError:
        return
    fleet.joined(replica, me)
    beating = threading.Thread(target=_heartbeats, args=(stub, me, stop))
    beating.start()
    holding = fleet.holding.setdefault(me, [])
    try:
        for n in range(100_000):
            if stop.is_set():
                break
            request = dpb.RecordObligationRequest(
                instance_id=me,
                session_key=f"agent:main:slack:dm:{tag}",
                message_ref=f"{tag}-{n}",
                content=f"reply {tag} {n}",
                platform="slack",
                chat_id=tag,
                begin_attempt=True,
            )
            row = stub.RecordObligation(request, timeout=TIMEOUT_S).obligation
            fleet.ack(row)
            if rng.random() < 0.1:
                holding.append(row)  # a slow send: delivered at the end of the round
                continue
            time.sleep(rng.uniform(0.0, 0.01))  # the platform send
            fleet.ack(_deliver(stub, me, row, fleet))
    except grpc.RpcError:
        return  # its replica died: the gateway is cut off (its lease runs out)
    finally:
        beating.join(timeout=10)
    for row in holding:
        fleet.ack(_deliver(stub, me, row, fleet))


def _deliver(
    stub: dpb_grpc.DeliveryServiceStub, me: str, row: dpb.Obligation, fleet: Fleet
) -> dpb.Obligation:
    request = dpb.MarkDeliveredRequest(obligation_id=row.id, instance_id=me, fence=row.fence)
    try:
        return stub.MarkDelivered(request, timeout=TIMEOUT_S).obligation
    except grpc.RpcError as error:
        if rpc_code(error) == grpc.StatusCode.FAILED_PRECONDITION:
            fleet.stale_fences.append(f"{me} lost {row.id}: {error}")
            return row
        raise


def _rescuer(
    stub: dpb_grpc.DeliveryServiceStub,
    replica: int,
    fleet: Fleet,
    stop: threading.Event,
) -> None:
    """A gateway's periodic claim: every CLAIM_INTERVAL_S, claim and deliver."""
    try:
        me = _register(stub, f"rescuer-{replica}")
        fleet.joined(replica, me)
        beating = threading.Thread(target=_heartbeats, args=(stub, me, stop))
        beating.start()
        try:
            while not stop.wait(CLAIM_INTERVAL_S):
                request = dpb.ClaimRecoverableRequest(instance_id=me, limit=1000)
                claimed = stub.ClaimRecoverable(request, timeout=TIMEOUT_S).obligations
                now = time.monotonic()
                for row in claimed:
                    with fleet.lock:
                        fleet.claims.setdefault(row.id, []).append((now, me, row.fence))
                    fleet.ack(row)
                for row in claimed:
                    fleet.ack(_deliver(stub, me, row, fleet))
        finally:
            beating.join(timeout=10)
    except grpc.RpcError:
        return


def _rescued_at(fleet: Fleet, row_id: str, cut_off: set[str], killed_at: float) -> float:
    """When a surviving replica's rescuer first claimed the row after the kill (0: not yet)."""
    with fleet.lock:
        times = [
            t for t, who, _ in fleet.claims.get(row_id, []) if who not in cut_off and t >= killed_at
        ]
    return min(times, default=0.0)


def _all_rescued(fleet: Fleet, orphans: set[str], cut_off: set[str], killed_at: float) -> bool:
    return all(_rescued_at(fleet, row_id, cut_off, killed_at) for row_id in orphans)


def test_a_delivery_replica_killed_mid_load(delivery_replicas: Replicas, postgres_url: str) -> None:
    rng = seeded("replica kill")
    bound = LEASE_TTL_S + CLAIM_INTERVAL_S
    fleet = Fleet()
    worst = 0.0
    orphans_total = 0
    for round_no in range(ROUNDS):
        victim = rng.randrange(REPLICAS)
        fleet.instances_on = {}
        stop, stop_rescuers = threading.Event(), threading.Event()
        gateways = [
            threading.Thread(
                target=_gateway,
                args=(
                    _delivery_stub(delivery_replicas, g % REPLICAS),
                    g % REPLICAS,
                    f"r{round_no}g{g}",
                    fleet,
                    random.Random(rng.randrange(2**32)),
                    stop,
                ),
            )
            for g in range(REPLICAS * CLIENTS_PER_REPLICA)
        ]
        rescuers = [
            threading.Thread(
                target=_rescuer,
                args=(_delivery_stub(delivery_replicas, r), r, fleet, stop_rescuers),
            )
            for r in range(REPLICAS)
        ]
        for thread in gateways + rescuers:
            thread.start()
        try:
            time.sleep(rng.uniform(0.5, 1.5))
            delivery_replicas.kill(victim)
            killed_at = time.monotonic()
            cut_off = fleet.instances_on.get(victim, set())
            assert cut_off, "nobody was connected to the killed replica"
            time.sleep(0.2)  # a commit the dead replica had sent may still land
            marks = ",".join("?" for _ in cut_off)
            orphans = {
                row_id
                for (row_id,) in sql(
                    postgres_url,
                    "SELECT id FROM ledger_obligation WHERE state IN "
                    f"('pending', 'attempting', 'failed') AND owner_instance_id IN ({marks})",
                    sorted(cut_off),
                )
            }

            rescued = partial(_all_rescued, fleet, orphans, cut_off, killed_at)
            wait_for(rescued, bound + 10, "the orphans to be claimed")
        finally:
            stop.set()
            join_all(gateways)
            stop_rescuers.set()
            join_all(rescuers)
        delays = [_rescued_at(fleet, row_id, cut_off, killed_at) - killed_at for row_id in orphans]
        worst = max([worst, *delays])
        orphans_total += len(orphans)
        assert all(d <= bound + SLACK_S for d in delays), (
            f"orphans claimed {max(delays):.2f} s after the kill; the bound is {bound:g} s "
            f"(+{SLACK_S:g} s slack)"
        )
        live = {i for r, ids in fleet.instances_on.items() if r != victim for i in ids}
        stolen = [s for s in fleet.stale_fences if s.split()[0] in live]
        assert not stolen, f"rows of live gateways were taken: {stolen}"
        fences = Counter((row_id, f) for row_id, claims in fleet.claims.items() for *_, f in claims)
        assert max(fences.values(), default=1) == 1, "one row claimed twice at one fence"

        delivery_replicas.restart(victim)
        rows = {
            row_id: (state, fence)
            for row_id, state, fence in sql(
                postgres_url, "SELECT id, state, fence FROM ledger_obligation"
            )
        }
        for row_id, acked in fleet.acked.items():
            assert row_id in rows, f"acknowledged {row_id} is gone"
            state, fence = rows[row_id]
            assert fence >= acked.fence, f"{row_id} went back to fence {fence}"
            if fence == acked.fence and acked.state == dpb.OBLIGATION_STATE_DELIVERED:
                assert state == "delivered", f"acknowledged delivery of {row_id} is lost"
        # Whatever the cut-off rescuer held is an orphan of the next round, or the sweep below.
    stub = _delivery_stub(delivery_replicas, 0)
    me = _register(stub, "sweeper")

    def swept() -> bool:
        claimed = stub.ClaimRecoverable(
            dpb.ClaimRecoverableRequest(instance_id=me, limit=1000), timeout=30
        ).obligations
        for row in claimed:
            fleet.ack(_deliver(stub, me, row, fleet))
        owed = sql(
            postgres_url,
            "SELECT count(*) FROM ledger_obligation WHERE state <> 'delivered'",
        )[0][0]
        return not owed

    wait_for(swept, bound + 10, "every row delivered", every_s=CLAIM_INTERVAL_S)
    print(
        f"replica kill: {ROUNDS} rounds, {len(fleet.acked)} rows, {orphans_total} orphans of "
        f"killed replicas claimed within {worst:.2f} s of the kill (bound {bound:g} s), "
        f"0 taken from live gateways"
    )
