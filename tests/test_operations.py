"""Operations: bearer tokens and agent scopes, metrics, access logs, TLS and mTLS."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, generate_latest

from switchboard.auth import parse_tokens
from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.observability import RpcMetrics, StateCollector
from switchboard.server import GrpcApp, ServerSettings
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.harness import EventLoopThread, Gateway, delivery_server, session_server
from tests.status import error_reason

ADMIN, MAIN_ONLY = "admin-token", "main-token"
GRANTS = parse_tokens(f"{ADMIN}=admin;{MAIN_ONLY}=agents:main")


def _as(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def secured(tmp_path: Path, loop_thread: EventLoopThread) -> Iterator[pb_grpc.SessionServiceStub]:
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    with session_server(loop_thread, url, auth=GRANTS) as service:
        for name in ("main", "other"):
            service.stub.CreateAgent(
                pb.CreateAgentRequest(agent=pb.Agent(name=name)), metadata=_as(ADMIN)
            )
        yield service.stub


@pytest.mark.parametrize("metadata", [(), _as("wrong-token"), (("authorization", ADMIN),)])
def test_calls_without_a_valid_token_are_unauthenticated(
    secured: pb_grpc.SessionServiceStub, metadata: tuple[tuple[str, str], ...]
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        secured.GetAgent(pb.GetAgentRequest(name="main"), metadata=metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_agent_scoped_tokens_act_for_their_agents_only(
    secured: pb_grpc.SessionServiceStub,
) -> None:
    assert secured.GetAgent(pb.GetAgentRequest(name="main"), metadata=_as(MAIN_ONLY)).agent
    source = pb.Source(transport="web", conversation_id="t")
    secured.ResolveSession(
        pb.ResolveSessionRequest(agent="main", source=source), metadata=_as(MAIN_ONLY)
    )
    refusals: list[Callable[[], object]] = [
        lambda: secured.GetAgent(pb.GetAgentRequest(name="other"), metadata=_as(MAIN_ONLY)),
        lambda: secured.Rewind(pb.RewindRequest(sequence=1), metadata=_as(MAIN_ONLY)),
        lambda: next(secured.WatchEvents(pb.WatchEventsRequest(), metadata=_as(MAIN_ONLY))),
    ]
    for call in refusals:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error_reason(refused.value) in ("AGENT_SCOPE", "ADMIN_ONLY")


def test_health_needs_no_token(tmp_path: Path, loop_thread: EventLoopThread) -> None:
    with session_server(loop_thread, f"sqlite:///{tmp_path / 's.sqlite3'}", auth=GRANTS) as s:
        health = health_pb2_grpc.HealthStub(s.channel)
        answer = health.Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_count_calls_by_status_and_expose_ledger_gauges(
    tmp_path: Path, loop_thread: EventLoopThread, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    url = f"sqlite:///{tmp_path / 'd.sqlite3'}"
    with delivery_server(loop_thread, url, metrics=RpcMetrics(registry)) as delivery:
        registry.register(StateCollector(delivery.unit.gauges))
        with caplog.at_level(logging.INFO, logger="switchboard.access"):
            gateway = Gateway(delivery.stub)
            gateway.record()
            with pytest.raises(grpc.RpcError):
                delivery.stub.GetObligation(
                    dpb.GetObligationRequest(obligation_id="nope"),
                    metadata=(("x-request-id", "req-42"),),
                )
            record = "/switchboard.delivery.v1.DeliveryService/RecordObligation"
            get = "/switchboard.delivery.v1.DeliveryService/GetObligation"
            # The server observes a call after its status went out: wait for it.
            failed_line = f'switchboard_rpc_total{{code="INVALID_ARGUMENT",method="{get}"}} 1.0'
            deadline = time.monotonic() + 10
            while failed_line not in (exposed := generate_latest(registry).decode()):
                assert time.monotonic() < deadline, exposed
                time.sleep(0.01)
    assert f'switchboard_rpc_total{{code="OK",method="{record}"}} 1.0' in exposed
    assert 'switchboard_ledger_rows{state="pending"} 1.0' in exposed
    assert "switchboard_ledger_live_instances 1.0" in exposed
    failed = [r for r in caplog.records if getattr(r, "method", "") == get]
    assert [(r.status, r.request_id) for r in failed] == [("INVALID_ARGUMENT", "req-42")]  # type: ignore[attr-defined]
    assert all(r.duration_ms >= 0 for r in failed)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("gateway@example.test")
    paths = {
        "ca": folder / "ca.pem",
        "cert": folder / "server.pem",
        "key": folder / "server.key",
        "client_cert": folder / "client.pem",
        "client_key": folder / "client.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    client.cert_chain_pems[0].write_to_path(str(paths["client_cert"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    return paths


def _register(address: str, credentials: grpc.ChannelCredentials | None) -> str:
    channel = (
        grpc.secure_channel(address, credentials)
        if credentials is not None
        else grpc.insecure_channel(address)
    )
    with channel:
        stub = dpb_grpc.DeliveryServiceStub(channel)
        request = dpb.RegisterInstanceRequest(gateway_name="gw", platforms=["slack"])
        return str(stub.RegisterInstance(request, timeout=5).instance.instance_id)


def test_tls_and_mtls(pki: dict[str, Path], tmp_path: Path, loop_thread: EventLoopThread) -> None:
    url = f"sqlite:///{tmp_path / 'd.sqlite3'}"
    ca = pki["ca"].read_bytes()
    with delivery_server(loop_thread, url, tls_cert=pki["cert"], tls_key=pki["key"]) as tls:
        assert _register(tls.address, grpc.ssl_channel_credentials(ca))
        with pytest.raises(grpc.RpcError):
            _register(tls.address, None)  # plaintext to a TLS port
    with delivery_server(
        loop_thread, url, tls_cert=pki["cert"], tls_key=pki["key"], tls_client_ca=pki["ca"]
    ) as mtls:
        with pytest.raises(grpc.RpcError):
            _register(mtls.address, grpc.ssl_channel_credentials(ca))  # no client certificate
        client = grpc.ssl_channel_credentials(
            ca, pki["client_key"].read_bytes(), pki["client_cert"].read_bytes()
        )
        assert _register(mtls.address, client)


def test_overload_is_resource_exhausted(tmp_path: Path, loop_thread: EventLoopThread) -> None:
    """--max-concurrent-rpcs counts unary calls; a watcher's stream holds no slot."""
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    with session_server(loop_thread, url, max_concurrent_rpcs=1) as service:
        service.stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="main")))
        watching = service.stub.WatchEvents(pb.WatchEventsRequest())
        assert next(watching).event.HasField("agent_created"), "the stream is running"
        service.stub.ListCheckpoints(pb.ListCheckpointsRequest(), timeout=5)
        watching.cancel()
    settings = ServerSettings(listen="127.0.0.1:0", drain_grace_s=5.0, max_concurrent_rpcs=1)
    app = GrpcApp(_SlowUnit(), settings)  # type: ignore[arg-type]
    loop_thread.run(app.start())
    with grpc.insecure_channel(app.address) as channel:
        wait: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Slow/Wait")
        in_flight = wait.future(b"", timeout=10)
        time.sleep(0.3)  # the call is running on the server, holding the only slot
        with pytest.raises(grpc.RpcError) as refused:
            wait(b"", timeout=5)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert in_flight.result(timeout=10) == b"done"
        assert wait(b"", timeout=5) == b"done", "the slot was given back"
    loop_thread.run(app.stop())


def test_services_wait_for_calls_in_one_task(tmp_path: Path, loop_thread: EventLoopThread) -> None:
    """grpc's aio server keeps a task per registered method waiting for its calls and
    waits on all of them again after every call it accepts (48 tasks cost a third of a
    no-op's instructions, issue 25): our services and health are served through their
    generic handlers, so reflection's one method is the only registered one."""
    url = f"sqlite:///{tmp_path / 's.sqlite3'}"
    with session_server(loop_thread, url) as service:
        service.stub.CreateAgent(pb.CreateAgentRequest(agent=pb.Agent(name="main")))
        health = health_pb2_grpc.HealthStub(service.channel)
        checked = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert checked.status == health_pb2.HealthCheckResponse.SERVING
        waiting = loop_thread.run(_registered_method_waiters())
    # 1, not 0: a grpc that renamed the task would pass a test of "none" without meaning it.
    assert waiting == 1, f"{waiting} registered-method tasks wait for calls"


async def _registered_method_waiters() -> int:
    return sum("_request_registered_call" in repr(task) for task in asyncio.all_tasks())


class _SlowUnit:
    """A tiny service with one slow call, to watch the server drain it."""

    service_name = "test.Slow"

    def add_to_server(self, server: grpc.aio.Server) -> None:
        async def wait(request: bytes, context: object) -> bytes:
            await asyncio.sleep(1.0)
            return b"done"

        handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(wait)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("test.Slow", {"Wait": handler}),)
        )

    def close(self) -> None:
        pass

    def gauges(self) -> list[object]:
        return []


def test_sigterm_drain_finishes_in_flight_calls(loop_thread: EventLoopThread) -> None:
    app = GrpcApp(_SlowUnit(), ServerSettings(listen="127.0.0.1:0", drain_grace_s=5.0))  # type: ignore[arg-type]
    loop_thread.run(app.start())
    channel = grpc.insecure_channel(app.address)
    wait: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/test.Slow/Wait")
    in_flight = wait.future(b"", timeout=10)
    time.sleep(0.3)  # the call is running on the server
    stopping = asyncio.run_coroutine_threadsafe(app.stop(), loop_thread.loop)
    assert in_flight.result(timeout=10) == b"done", "the in-flight call completed"
    stopping.result(timeout=10)
    with pytest.raises(grpc.RpcError) as refused:
        wait(b"", timeout=2)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    channel.close()
