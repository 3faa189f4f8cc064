"""Server processes: SIGKILL loses nothing acknowledged, two processes share one
SQLite file without "database is locked", SIGTERM drains and exits 0."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc
from tests.harness import ServerProcess

pytestmark = pytest.mark.slow

WRITERS = 4


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for process in started:
        process.stop_quietly()


def _stub(address: str) -> tuple[grpc.Channel, pb_grpc.DeliveryServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.DeliveryServiceStub(channel)


def _register(stub: pb_grpc.DeliveryServiceStub) -> str:
    request = pb.RegisterInstanceRequest(gateway_name="gw", pid=os.getpid(), platforms=["slack"])
    return str(stub.RegisterInstance(request, timeout=10).instance.instance_id)


def _record(stub: pb_grpc.DeliveryServiceStub, instance_id: str, tag: str) -> pb.Obligation:
    request = pb.RecordObligationRequest(
        instance_id=instance_id,
        session_key=f"agent:main:slack:dm:{tag}",
        message_ref=tag,
        content=f"reply {tag}",
        platform="slack",
        chat_id="C1",
    )
    return stub.RecordObligation(request, timeout=10).obligation


def test_sigkill_loses_no_acknowledged_obligation(
    database_url: str, tmp_path: Path, processes: list[ServerProcess]
) -> None:
    server = ServerProcess(database_url, tmp_path)
    processes.append(server)
    channel, stub = _stub(server.start())
    acknowledged: list[pb.Obligation] = []
    stop = threading.Event()

    def writer(index: int) -> None:
        instance_id = _register(stub)
        for i in range(100_000):
            if stop.is_set():
                return
            try:
                acknowledged.append(_record(stub, instance_id, f"w{index}-{i}"))
            except grpc.RpcError:
                return  # the server died under us: this one was never acknowledged

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while len(acknowledged) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    server.kill()
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    channel.close()
    assert len(acknowledged) >= 300

    restarted = ServerProcess(database_url, tmp_path)
    processes.append(restarted)
    channel, stub = _stub(restarted.start())
    with channel:
        for row in acknowledged:
            stored = stub.GetObligation(pb.GetObligationRequest(obligation_id=row.id), timeout=10)
            assert stored.obligation.content == row.content
    if database_url.startswith("sqlite:///"):
        database = sqlite3.connect(database_url.removeprefix("sqlite:///"))
        assert database.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        database.close()


def test_two_processes_share_one_sqlite_file_without_lock_errors(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    servers = [ServerProcess(url, tmp_path), ServerProcess(url, tmp_path)]
    processes.extend(servers)
    addresses = [server.start() for server in servers]
    errors: list[grpc.RpcError] = []
    cycles = [0] * WRITERS

    def gateway(index: int) -> None:
        channel, stub = _stub(addresses[index % 2])
        with channel:
            instance_id = _register(stub)
            deadline = time.monotonic() + 3
            i = 0
            while time.monotonic() < deadline:
                i += 1
                try:
                    row = _record(stub, instance_id, f"g{index}-{i}")
                    holder: dict[str, Any] = {
                        "obligation_id": row.id,
                        "instance_id": instance_id,
                        "fence": row.fence,
                    }
                    stub.MarkAttempting(pb.MarkAttemptingRequest(**holder), timeout=10)
                    stub.MarkDelivered(pb.MarkDeliveredRequest(**holder), timeout=10)
                    cycles[index] += 1
                except grpc.RpcError as exc:
                    errors.append(exc)

    threads = [threading.Thread(target=gateway, args=(i,)) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert all(count > 0 for count in cycles)
    channel, stub = _stub(addresses[0])
    with channel:
        stats = stub.GetLedgerStats(pb.GetLedgerStatsRequest(), timeout=10)
    delivered = {c.state: c.count for c in stats.state_counts}[pb.OBLIGATION_STATE_DELIVERED]
    assert delivered == sum(cycles)


def test_health_reflection_and_sigterm_drain(
    tmp_path: Path, processes: list[ServerProcess]
) -> None:
    server = ServerProcess(f"sqlite:///{tmp_path / 'd.sqlite3'}", tmp_path)
    processes.append(server)
    channel = grpc.insecure_channel(server.start())
    with channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "switchboard.delivery.v1.DeliveryService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        listed = next(
            iter(
                reflection.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
                )
            )
        )
        names = {service.name for service in listed.list_services_response.service}
        assert "switchboard.delivery.v1.DeliveryService" in names
        assert "grpc.health.v1.Health" in names
    assert server.terminate() == 0
