"""Lost answers: the real clients retry writes with their request id, nothing is doubled.

A TCP proxy on 127.0.0.1 between client and server drops the connection after a
request reached the server and before its answer came back, for about a third of
the calls. The clients retry (the channel's transparent retry, or their own loop)
with the same request id; afterwards the database must hold every write the
client saw succeed exactly once. On Postgres a second variant sends the first
attempt to replica A through the proxy and the retry straight to replica B.

SWITCHBOARD_CHAOS_ROUNDS multiplies the calls (CI runs one round).
"""

from __future__ import annotations

import inspect
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from switchboard_client import DeliveryClient, SessionClient, SwitchboardError

from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import (
    EventLoopThread,
    InProcessDelivery,
    InProcessSession,
    delivery_server,
    session_server,
)
from tests.tcp_proxy import Link, TcpProxy

ROUNDS = int(os.environ.get("SWITCHBOARD_CHAOS_ROUNDS", "1"))
WORKERS = 8
#: Logical calls per worker and round (each worker: its own clients, one connection).
CALLS_PER_WORKER = 45
LOSS = 1 / 3
#: More than the HTTP/2 preface and settings a client sends before its first call:
#: chunks before that are handshake, never dropped.
HANDSHAKE_BYTES = 120


class LosingPolicy:
    """Drops about `loss` of the answers: the first server chunk after new request bytes."""

    def __init__(self, loss: float, seed: int) -> None:
        self.loss = loss
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.dropped = 0
        self._decided: dict[int, int] = {}  # link -> client bytes when last decided

    def __call__(self, link: Link, chunk: bytes) -> bool:
        with self.lock:
            sent = link.sent_by_client
            if sent <= HANDSHAKE_BYTES or self._decided.get(id(link)) == sent:
                return True
            self._decided[id(link)] = sent
            if self.random.random() >= self.loss:
                return True
            self.dropped += 1
            return False


@dataclass
class Seen:
    """What the clients saw succeed, by kind, as unique markers."""

    ok: dict[str, list[str]] = field(default_factory=dict)
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, marker: str) -> None:
        with self.lock:
            self.ok.setdefault(kind, []).append(marker)


def _message(text: str) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, content=text)


def _logged(session: InProcessSession) -> Counter[tuple[str, str]]:
    """(kind, content) of every message-bearing event in the log, counted."""
    database: Any = session.unit.runner.backend.database

    def read() -> list[bytes]:
        return [bytes(row[0]) for row in database.execute_sql("SELECT payload FROM session_log")]

    counts: Counter[tuple[str, str]] = Counter()
    for payload in session.unit.runner.submit_read(read).result(timeout=60):
        event = pb.Event.FromString(payload)
        body = event.WhichOneof("body")
        if body in ("message_appended", "inbox_posted"):
            counts[(body, getattr(event, body).message.content)] += 1
    return counts


def _ledger(delivery: InProcessDelivery) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Obligation contents, delivered ones, and instance gateway names, counted."""
    database: Any = delivery.unit.runner.backend.database

    def read() -> tuple[list[Any], list[Any]]:
        rows = list(database.execute_sql("SELECT content, state FROM ledger_obligation"))
        names = list(database.execute_sql("SELECT gateway_name FROM ledger_instance"))
        return rows, names

    rows, names = delivery.unit.runner.submit_read(read).result(timeout=60)
    return (
        Counter(str(row[0]) for row in rows),
        Counter(str(row[0]) for row in rows if row[1] == "delivered"),
        Counter(str(row[0]) for row in names),
    )


Call = Callable[[SessionClient, DeliveryClient, str], None]


class Workload:
    """The mix of writes every worker drives; each call carries a unique marker."""

    def __init__(self, sessions: SessionClient, ledger: DeliveryClient, seen: Seen) -> None:
        self.instance_id = ledger.register("gw-setup", ["slack"], lease_ttl_s=600).instance_id
        sessions.create_agent("helper")
        sessions.create_agent("main", peers=["helper"])
        self.session_id = sessions.resolve("main", transport="web", conversation_id="t").session
        self.session_id_str = self.session_id.session_id
        delegated = sessions.delegate("main", self.session_id_str, "helper", _message("setup"))
        self.helper_session = delegated.session.session_id
        self.seen = seen

    def calls(self) -> list[tuple[str, Call]]:
        main, helper = self.session_id_str, self.helper_session
        return [
            ("message_appended", lambda s, d, m: self._append(s, main, m)),
            ("inbox_posted", lambda s, d, m: s.post_to_inbox("main", main, _message(m)) and None),
            ("delegated", lambda s, d, m: s.delegate("main", main, "helper", _message(m)) and None),
            (
                "peer_sent",
                lambda s, d, m: (
                    s.send_to_peer("main", main, "helper", _message(m), to_session_id=helper)
                    and None
                ),
            ),
            ("recorded", self._record_and_deliver),
            ("registered", lambda s, d, m: d.register(m, ["slack"]) and None),
        ]

    @staticmethod
    def _append(sessions: SessionClient, session_id: str, marker: str) -> None:
        event = pb.SessionEventInput(message_appended=pb.MessageAppended(message=_message(marker)))
        sessions.append("main", session_id, event)

    def _record_and_deliver(self, sessions: SessionClient, ledger: DeliveryClient, m: str) -> None:
        instance = self.instance_id
        answer = ledger.record(instance, session_key="s", content=m, platform="slack", chat_id="C1")
        assert answer.created, "a retried record answers with the first call's created=True"
        ledger.mark_delivered(instance, answer.obligation, "pm")


def _drive(
    workload: Workload,
    clients: Callable[[], tuple[SessionClient, DeliveryClient]],
    call_with_retry: Callable[[Call, SessionClient, DeliveryClient, str], None] | None = None,
) -> None:
    calls = workload.calls()

    def worker(n: int) -> None:
        sessions, ledger = clients()
        try:
            for i in range(CALLS_PER_WORKER * ROUNDS):
                kind, call = calls[(i + n) % len(calls)]
                marker = f"{kind}-{n}-{i}-{uuid.uuid4().hex[:8]}"
                try:
                    if call_with_retry is None:
                        call(sessions, ledger, marker)
                    else:
                        call_with_retry(call, sessions, ledger, marker)
                except SwitchboardError as error:
                    with workload.seen.lock:
                        workload.seen.failed += 1
                        workload.seen.errors.append(f"{kind}: {error}")
                    continue
                workload.seen.add(kind, marker)
        finally:
            sessions.close()
            ledger.close()

    with ThreadPoolExecutor(WORKERS) as pool:
        list(pool.map(worker, range(WORKERS)))


def _assert_exactly_once(seen: Seen, session: InProcessSession, delivery: InProcessDelivery) -> int:
    logged = _logged(session)
    contents, delivered, names = _ledger(delivery)
    where = {
        "message_appended": lambda m: logged[("message_appended", m)],
        "inbox_posted": lambda m: logged[("inbox_posted", m)],
        "delegated": lambda m: logged[("inbox_posted", m)],
        "peer_sent": lambda m: logged[("inbox_posted", m)],
        "recorded": lambda m: contents[m] if delivered[m] == 1 else 0,
        "registered": lambda m: names[m],
    }
    checked = 0
    for kind, markers in seen.ok.items():
        for marker in markers:
            assert where[kind](marker) == 1, f"{kind} {marker} stored {where[kind](marker)} times"
            checked += 1
    # Nothing is doubled, seen or not (a call that failed for good may be there once).
    doubled = [str(key) for key, count in logged.items() if count > 1 and key[1] != "setup"]
    doubled += [name for name, count in contents.items() if count > 1]
    doubled += [name for name, count in names.items() if count > 1 and name != "gw-setup"]
    assert doubled == []
    return checked


def _assert_few_gave_up(seen: Seen) -> None:
    """A call whose every attempt lost its answer (a third of them are lost) gives up,
    as a client should; that is rare, and whatever it wrote is there at most once
    (checked above). Most calls must have got through."""
    calls = WORKERS * CALLS_PER_WORKER * ROUNDS
    assert seen.failed <= calls // 50, seen.errors
    assert all("UNAVAILABLE" in error for error in seen.errors), seen.errors


def _report(label: str, dropped: int, checked: int, failed: int) -> None:
    print(
        f"\n[lost answers] {label}: {dropped} answers lost and retried, "
        f"{checked} calls checked, 0 duplicates, {failed} calls failed for good"
    )


def test_retried_writes_are_stored_exactly_once(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    with ExitStack() as stack:
        session = stack.enter_context(session_server(loop_thread, database_url))
        delivery = stack.enter_context(delivery_server(loop_thread, database_url))
        session_host, session_port = session.address.rsplit(":", 1)
        delivery_host, delivery_port = delivery.address.rsplit(":", 1)
        to_session = stack.enter_context(TcpProxy((session_host, int(session_port))))
        to_delivery = stack.enter_context(TcpProxy((delivery_host, int(delivery_port))))
        seen = Seen()
        with SessionClient(session.address) as setup, DeliveryClient(delivery.address) as gw:
            workload = Workload(setup, gw, seen)
        policy = LosingPolicy(LOSS, seed=7)
        to_session.on_reply = policy
        to_delivery.on_reply = policy

        def clients() -> tuple[SessionClient, DeliveryClient]:
            return SessionClient(to_session.address), DeliveryClient(to_delivery.address)

        _drive(workload, clients)
        to_session.on_reply = to_delivery.on_reply = None
        checked = _assert_exactly_once(seen, session, delivery)
        assert policy.dropped > CALLS_PER_WORKER * WORKERS * ROUNDS / 5, "the proxy lost answers"
        _assert_few_gave_up(seen)
        _report(database_url.split(":")[0], policy.dropped, checked, seen.failed)


@pytest.mark.postgres
def test_a_retry_on_another_replica_is_answered_from_the_first_ones_record(
    loop_thread: EventLoopThread, postgres_url: str
) -> None:
    with ExitStack() as stack:
        session_a = stack.enter_context(session_server(loop_thread, postgres_url))
        session_b = stack.enter_context(session_server(loop_thread, postgres_url))
        delivery_a = stack.enter_context(delivery_server(loop_thread, postgres_url))
        delivery_b = stack.enter_context(delivery_server(loop_thread, postgres_url))
        proxies = [
            stack.enter_context(TcpProxy((host, int(port))))
            for host, port in (s.address.rsplit(":", 1) for s in (session_a, delivery_a))
        ]
        seen = Seen()
        with SessionClient(session_a.address) as setup, DeliveryClient(delivery_a.address) as gw:
            workload = Workload(setup, gw, seen)
        policy = LosingPolicy(LOSS, seed=11)
        for proxy in proxies:
            proxy.on_reply = policy
        retried_on_b = Counter[str]()
        to_b = (SessionClient(session_b.address), DeliveryClient(delivery_b.address))
        stack.callback(to_b[0].close)
        stack.callback(to_b[1].close)

        def clients() -> tuple[SessionClient, DeliveryClient]:
            # Channels of our own: no transparent retry, no retry loop; the retry
            # goes to replica B below, with the first attempt's request id.
            return (
                SessionClient(
                    "", channel=grpc.insecure_channel(proxies[0].address), mutation_attempts=1
                ),
                DeliveryClient(
                    "", channel=grpc.insecure_channel(proxies[1].address), mutation_attempts=1
                ),
            )

        def via_b(call: Call, sessions: SessionClient, ledger: DeliveryClient, m: str) -> None:
            ids = _FixedIds()
            try:
                call(ids.wrap(sessions), ids.wrap(ledger), m)
            except SwitchboardError as lost:
                if lost.code not in (grpc.StatusCode.UNAVAILABLE,):
                    raise
                retried_on_b["calls"] += 1
                call(ids.replay(to_b[0]), ids.replay(to_b[1]), m)

        _drive(workload, clients, via_b)
        checked = _assert_exactly_once(seen, session_a, delivery_a)
        assert retried_on_b["calls"] > CALLS_PER_WORKER * WORKERS * ROUNDS / 5
        _assert_few_gave_up(seen)
        _report("postgres, retry on replica B", retried_on_b["calls"], checked, seen.failed)


class _FixedIds:
    """Gives each write of one logical call a recorded request id, and replays them in
    order on another client: the same ids, so replica B finds replica A's records."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def wrap(self, client: Any) -> Any:
        return _IdProxy(client, self.ids, replay=False)

    def replay(self, client: Any) -> Any:
        return _IdProxy(client, self.ids, replay=True)


class _IdProxy:
    def __init__(self, client: Any, ids: list[str], replay: bool) -> None:
        self._client, self._ids, self._replay, self._next = client, ids, replay, 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if "request_id" not in inspect.signature(method).parameters:
                return method(*args, **kwargs)
            if self._replay and self._next < len(self._ids):
                kwargs["request_id"] = self._ids[self._next]
            else:
                kwargs["request_id"] = str(uuid.uuid4())
                self._ids.append(kwargs["request_id"])
            self._next += 1
            return method(*args, **kwargs)

        return call


@pytest.fixture
def postgres_url() -> Iterator[str]:
    from tests.harness import postgres_schema, postgres_unreachable_reason

    reason = postgres_unreachable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true" or os.environ.get("SWITCHBOARD_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    with postgres_schema() as url:
        yield url


def test_an_answer_held_past_the_deadline_is_retried_with_a_fresh_deadline(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    """DEADLINE_EXCEEDED is final for gRPC's own retries (the deadline spans them);
    the client's loop gives each attempt a deadline of its own, with the same id."""
    with ExitStack() as stack:
        delivery = stack.enter_context(delivery_server(loop_thread, database_url))
        host, port = delivery.address.rsplit(":", 1)
        proxy = stack.enter_context(TcpProxy((host, int(port))))
        held = threading.Event()

        def hold_one_answer(link: Link, chunk: bytes) -> bool:
            if link.sent_by_client <= HANDSHAKE_BYTES or held.is_set():
                return True
            held.set()
            # Past the attempt's 1 s deadline, then the link drops: the next attempt (on
            # the held connection) fails over to a fresh one well within its own second,
            # and a third remains, however loaded the machine is.
            time.sleep(1.5)
            return False

        with DeliveryClient(delivery.address) as direct:
            instance = direct.register("gw", ["slack"]).instance_id
        for attempts, expect_ok in ((1, False), (3, True)):
            held.clear()
            proxy.on_reply = hold_one_answer
            with DeliveryClient(proxy.address, timeout_s=1.0, mutation_attempts=attempts) as client:
                content = f"held-{attempts}"
                try:
                    answer = client.record(
                        instance,
                        session_key="held",
                        content=content,
                        platform="slack",
                        chat_id="C1",
                    )
                except SwitchboardError as error:
                    assert not expect_ok and error.code is grpc.StatusCode.DEADLINE_EXCEEDED
                else:
                    assert expect_ok and answer.created
            proxy.on_reply = None
        contents, _, _ = _ledger(delivery)
        assert contents["held-1"] == 1  # the first attempt ran though its answer was lost
        assert contents["held-3"] == 1  # retried, written once
