"""Request ids (AIP-155): a retry with the same id is answered, not run again.

Real servers on both backends through generated stubs; the lost-answer proxy
test with the real clients is tests/clients/test_lost_answers.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from delivery_service.migrations import DELIVERY_SCHEMA
from delivery_service.state_machine import LedgerLimits
from session_service.core import SessionLimits
from switchboard import migrations
from switchboard.auth import parse_tokens
from switchboard.backends import open_backend
from switchboard.database import DatabaseSettings
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.errors import NotFound
from switchboard.idempotency import (
    LEDGER_REQUESTS,
    Replayed,
    RequestGuard,
    RequestStore,
)
from switchboard.mutations import Mutations
from switchboard.runner import TransactionRunner
from switchboard.session.v1 import session_service_pb2 as pb
from tests.harness import (
    EventLoopThread,
    Gateway,
    InProcessDelivery,
    InProcessSession,
    delivery_server,
    session_server,
)
from tests.session.conftest import create_agent, resolve, user_message, web
from tests.status import error_details


@pytest.fixture
def service(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessSession]:
    with session_server(loop_thread, database_url) as server:
        yield server


@pytest.fixture
def ledger(database_url: str, loop_thread: EventLoopThread) -> Iterator[InProcessDelivery]:
    with delivery_server(loop_thread, database_url) as server:
        yield server


def _new_id() -> str:
    return str(uuid.uuid4())


def _open_session(service: InProcessSession) -> str:
    create_agent(service.stub)
    return resolve(service.stub, **web()).session.session_id


def _append(session_id: str, text: str, request_id: str, **extra: Any) -> pb.AppendEventsRequest:
    return pb.AppendEventsRequest(
        agent="main",
        session_id=session_id,
        events=[user_message(text)],
        request_id=request_id,
        **extra,
    )


def _version(service: InProcessSession, session_id: str) -> int:
    request = pb.GetSessionRequest(agent="main", session_id=session_id)
    return int(service.stub.GetSession(request).session.version)


def _records(unit: Any) -> int:
    return int(unit.runner.submit_read(unit.requests.count).result(timeout=10))


def test_a_retried_append_is_answered_with_the_first_answer_and_written_once(
    service: InProcessSession,
) -> None:
    session_id = _open_session(service)
    request = _append(session_id, "hello", _new_id(), expected_version=1)
    first = service.stub.AppendEvents(request)
    again = service.stub.AppendEvents(request)  # as after a lost answer
    assert again.SerializeToString() == first.SerializeToString()
    assert first.version == 2 and _version(service, session_id) == 2
    # Without an id the same request is a new call (and now a stale one).
    request.ClearField("request_id")
    with pytest.raises(grpc.RpcError) as stale:
        service.stub.AppendEvents(request)
    assert stale.value.code() is grpc.StatusCode.ABORTED


def test_the_same_id_with_another_request_is_refused_and_writes_nothing(
    service: InProcessSession,
) -> None:
    session_id = _open_session(service)
    request_id = _new_id()
    service.stub.AppendEvents(_append(session_id, "hello", request_id))
    for other in (
        lambda: service.stub.AppendEvents(_append(session_id, "hello!", request_id)),
        lambda: service.stub.PostToInbox(
            pb.PostToInboxRequest(
                agent="main",
                session_id=session_id,
                message=pb.Message(role=pb.ROLE_USER, content="hello"),
                request_id=request_id,
            )
        ),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            other()
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        info, fields = error_details(refused.value)
        assert (info.reason, fields) == ("REQUEST_ID_REUSED", ["request_id"])
    assert _version(service, session_id) == 2
    state = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    ).state
    assert not state.inbox


def test_a_failed_call_is_not_remembered_so_its_retry_runs_again(
    service: InProcessSession,
) -> None:
    session_id = _open_session(service)
    request = _append(session_id, "late", _new_id(), expected_version=2)
    with pytest.raises(grpc.RpcError) as early:
        service.stub.AppendEvents(request)
    assert early.value.code() is grpc.StatusCode.ABORTED
    service.stub.AppendEvents(_append(session_id, "first", ""))  # version 1 -> 2
    assert service.stub.AppendEvents(request).version == 3
    assert _records(service.unit) == 1


@pytest.mark.parametrize("bad", ["not a uuid", "x" * 65, "ä", "a/b"])
def test_a_malformed_request_id_is_invalid(service: InProcessSession, bad: str) -> None:
    session_id = _open_session(service)
    with pytest.raises(grpc.RpcError) as invalid:
        service.stub.AppendEvents(_append(session_id, "hello", bad))
    assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(invalid.value)[1] == ["request_id"]
    assert _version(service, session_id) == 1


def test_a_replayed_record_obligation_still_says_created(ledger: InProcessDelivery) -> None:
    gateway = Gateway(ledger.stub)
    request_id = _new_id()
    first = gateway.record(request_id=request_id)
    again = gateway.record(request_id=request_id)
    plain = gateway.record()  # no id: insert-or-ignore finds the row
    assert first.created and again.created and not plain.created
    assert again.SerializeToString() == first.SerializeToString()


def test_racing_attempts_with_one_id_run_once_and_get_one_answer(
    ledger: InProcessDelivery, service: InProcessSession
) -> None:
    session_id = _open_session(service)
    register = dpb.RegisterInstanceRequest(
        gateway_name="gw", host="h", pid=1, platforms=["slack"], request_id=_new_id()
    )
    post = pb.PostToInboxRequest(
        agent="main",
        session_id=session_id,
        message=pb.Message(role=pb.ROLE_USER, content="once"),
        request_id=_new_id(),
    )
    barrier = threading.Barrier(8)

    def race(call: Callable[[], Any]) -> bytes:
        barrier.wait()
        while True:  # as the clients do: an attempt that met another in flight retries
            try:
                return bytes(call().SerializeToString())
            except grpc.RpcError as error:
                if error_details(error)[0].reason != "REQUEST_IN_FLIGHT":
                    raise
                time.sleep(0.01)

    with ThreadPoolExecutor(8) as pool:
        registered = set(
            pool.map(lambda _: race(lambda: ledger.stub.RegisterInstance(register)), range(8))
        )
        posted = set(pool.map(race, [lambda: service.stub.PostToInbox(post)] * 8))
    assert len(registered) == 1 and len(posted) == 1
    stats = ledger.stub.GetLedgerStats(dpb.GetLedgerStatsRequest())
    assert stats.live_instance_count == 1
    state = service.stub.GetSessionState(
        pb.GetSessionStateRequest(agent="main", session_id=session_id)
    ).state
    assert [m.message.content for m in state.inbox] == ["once"]


def test_ids_are_scoped_to_the_callers_credentials(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    grants = parse_tokens("a=agents:main;b=agents:main,other;root=admin")
    with session_server(loop_thread, database_url, auth=grants) as server:
        admin = (("authorization", "Bearer root"),)
        server.stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="main")), metadata=admin)
        resolved = server.stub.ResolveSession(
            pb.ResolveSessionRequest(agent="main", source=pb.Source(**web())), metadata=admin
        )
        session_id = resolved.session.session_id
        request = _append(session_id, "hello", _new_id())
        as_a = server.stub.AppendEvents(request, metadata=(("authorization", "Bearer a"),))
        as_b = server.stub.AppendEvents(request, metadata=(("authorization", "Bearer b"),))
        assert (as_a.version, as_b.version) == (2, 3)  # another principal: another call


def test_an_expired_record_is_pruned_and_its_id_runs_again(
    database_url: str, loop_thread: EventLoopThread
) -> None:
    limits = LedgerLimits(request_id_window_s=0.5)
    with delivery_server(loop_thread, database_url, limits) as server:
        request = dpb.RegisterInstanceRequest(gateway_name="gw", pid=1, request_id=_new_id())
        first = server.stub.RegisterInstance(request).instance.instance_id
        assert server.stub.RegisterInstance(request).instance.instance_id == first
        assert _records(server.unit) == 1
        time.sleep(0.6)  # past the window (and the prune interval, the window here)
        other = dpb.RegisterInstanceRequest(gateway_name="gw", pid=2, request_id=_new_id())
        server.stub.RegisterInstance(other)
        assert _records(server.unit) == 1  # the expired one was pruned by that write
        assert server.stub.RegisterInstance(request).instance.instance_id != first


def test_one_group_commit_batch_with_one_id_twice_runs_the_op_once(database_url: str) -> None:
    settings = DatabaseSettings(url=database_url, writer_threads=1)  # one batch at a time
    backend = open_backend(settings)
    migrations.prepare(backend, DELIVERY_SCHEMA)
    store = RequestStore(backend, LEDGER_REQUESTS)
    runner = TransactionRunner(backend, settings)
    runs: list[int] = []
    release = threading.Event()
    try:
        # Hold the writer so that the attempts queue up and commit as one batch.
        hold = runner.submit_write(lambda _now: release.wait(10))

        def attempt(n: int) -> Future[int]:
            guard = RequestGuard(store, "", "rid-1", "/Test/Op", "print", lambda r: str(r).encode())

            def op(_now: float) -> int:
                runs.append(n)
                return n

            return runner.submit_write(op, guard)

        attempts = [attempt(n) for n in range(3)]
        failing = RequestGuard(store, "", "rid-2", "/Test/Op", "print", lambda r: b"")

        def refuse(_now: float) -> None:
            raise NotFound("GONE", "refused")

        refused = runner.submit_write(refuse, failing)
        release.set()
        hold.result(timeout=10)
        outcomes: list[Any] = []
        for future in attempts:
            try:
                outcomes.append(future.result(timeout=10))
            except Replayed as replayed:
                outcomes.append(replayed.response)
        with pytest.raises(NotFound):
            refused.result(timeout=10)
        assert runs == [0] and outcomes == [0, b"0", b"0"]
        assert runner.submit_read(store.count).result(timeout=10) == 1, "rid-2 left no record"
    finally:
        release.set()
        runner.close()


_declared = Mutations(dpb.DESCRIPTOR.services_by_name["DeliveryService"])


class _TwoWrites:
    """A servicer whose one RPC writes twice, the request id going to its first write."""

    def __init__(self, runner: TransactionRunner, requests: RequestStore) -> None:
        self.runner = runner
        self.requests = requests
        self.ran: list[str] = []

    def _op(self, name: str) -> Callable[[float], str]:
        def op(_now: float) -> str:
            self.ran.append(name)
            return name

        return op

    @_declared(lambda name: dpb.RegisterInstanceResponse(instance=dpb.Instance(instance_id=name)))
    async def RegisterInstance(  # noqa: N802
        self, request: dpb.RegisterInstanceRequest, context: Any, guard: RequestGuard | None
    ) -> str:
        first = await self.runner.write(self._op("first"), guard)
        await self.runner.write(self._op("second"))
        return first


async def _register(servicer: _TwoWrites, request: dpb.RegisterInstanceRequest) -> str:
    answer = await servicer.RegisterInstance(request, None)
    return str(answer.instance.instance_id)


@pytest.fixture
def ledger_runner(database_url: str) -> Iterator[tuple[TransactionRunner, RequestStore]]:
    settings = DatabaseSettings(url=database_url)
    backend = open_backend(settings)
    migrations.prepare(backend, DELIVERY_SCHEMA)
    runner = TransactionRunner(backend, settings)
    try:
        yield runner, RequestStore(backend, LEDGER_REQUESTS)
    finally:
        runner.close()


def test_a_call_that_writes_twice_records_its_request_id_with_its_first_write_only(
    ledger_runner: tuple[TransactionRunner, RequestStore],
) -> None:
    runner, store = ledger_runner
    servicer = _TwoWrites(runner, store)
    request = dpb.RegisterInstanceRequest(gateway_name="gw", request_id=_new_id())
    assert asyncio.run(_register(servicer, request)) == "first"
    assert servicer.ran == ["first", "second"]
    assert asyncio.run(_register(servicer, request)) == "first"  # the stored answer
    assert servicer.ran == ["first", "second"], "the retry replays at its first write"
    assert runner.submit_read(store.count).result(timeout=10) == 1


def test_a_request_guard_given_to_a_second_write_is_refused(
    ledger_runner: tuple[TransactionRunner, RequestStore],
) -> None:
    runner, store = ledger_runner
    guard = RequestGuard(store, "", "rid-1", "/Test/Op", "print", lambda r: str(r).encode())
    assert runner.submit_write(lambda _now: 1, guard).result(timeout=10) == 1
    with pytest.raises(RuntimeError, match="second write"):
        runner.submit_write(lambda _now: 2, guard)
    assert runner.submit_read(store.count).result(timeout=10) == 1


def test_the_window_is_a_serve_option() -> None:
    from click.testing import CliRunner

    from switchboard_cli.main import main

    result = CliRunner().invoke(main, ["serve", "--help"])
    assert "--request-id-window" in result.output
    assert SessionLimits().request_id_window_s == LedgerLimits().request_id_window_s == 86400


@pytest.mark.parametrize("module_name", ["session_service.servicer", "delivery_service.servicer"])
def test_every_declared_handler_hands_its_guard_on(module_name: str) -> None:
    """A handler that dropped its guard would run without its request id, silently:
    each declared handler passes `guard=guard` to its rule (read from its source)."""
    import importlib
    import inspect

    module = importlib.import_module(module_name)
    servicer = next(
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and value.__module__ == module_name
        and "Servicer" in value.__name__
    )
    declared = module.mutation.declared
    assert declared, "no RPC declared"
    dropped = [
        name
        for name in sorted(declared)
        if "guard=guard" not in inspect.getsource(inspect.unwrap(getattr(servicer, name)))
    ]
    assert dropped == [], f"handlers that do not hand their guard on: {dropped}"
