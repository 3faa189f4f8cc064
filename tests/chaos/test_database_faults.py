"""Database faults next to process kills, at random moments under load.

Both services run as processes on a Postgres database of the test's own, loaded by
appending threads and obligation-recording threads. Each round picks one fault at
random: every connection terminated (`pg_terminate_backend`), the database taken
away for 1-3 s (ALLOW_CONNECTIONS false plus terminating), or a service SIGKILLed
and restarted. Afterwards every call answered OK or UNAVAILABLE (DEADLINE_EXCEEDED
only while a process was dead), every acknowledged append and obligation is
stored, and the session log is exactly 1..head. Time to recover (first OK after
the fault ended) is printed per fault kind.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.chaos.common import (
    DEADLINE,
    ROUNDS,
    Processes,
    assert_gap_free,
    seeded,
    session_log,
    wait_for,
)
from tests.harness import ServerProcess, postgres_unreachable_reason
from tests.pg_faults import Load, PrivateDatabase, private_database
from tests.session.conftest import user_message

pytestmark = [pytest.mark.chaos, pytest.mark.slow, pytest.mark.postgres, DEADLINE]

THREADS = 3
FAULTS = ("terminate", "outage", "kill-session", "kill-delivery")


@dataclass
class Service:
    """A server process and a channel to it; replaced when the process is killed."""

    server: ServerProcess
    channel: grpc.Channel
    #: The server's flags, kept across restarts.
    flags: tuple[str, ...] = ()
    #: Channels to killed processes, closed at the end (a load thread may hold one).
    old: list[grpc.Channel] = field(default_factory=list)

    def restart(self, processes: Processes, url: str) -> None:
        self.server.kill()
        self.old.append(self.channel)
        self.server = processes.server(url, *self.flags, service=self.server.service)
        self.channel = grpc.insecure_channel(self.server.address)

    def close(self) -> None:
        for channel in (self.channel, *self.old):
            channel.close()


def _start(processes: Processes, url: str, service: str) -> Service:
    # The recorder registers once and never heartbeats: its lease must outlast the
    # run, however many rounds SWITCHBOARD_CHAOS_ROUNDS asks for.
    flags = ("--lease-ttl", "3600") if service == "delivery" else ()
    server = processes.server(url, *flags, service=service)
    return Service(server, grpc.insecure_channel(server.address), flags)


def _appender(service: Service) -> Callable[[int, int], int]:
    stub = spb_grpc.SessionServiceStub(service.channel)
    stub.CreateAgent(spb.CreateAgentRequest(agent=spb.Agent(name="main")))
    sessions = [
        stub.ResolveSession(
            spb.ResolveSessionRequest(
                agent="main", source=spb.Source(transport="web", conversation_id=f"tab-{i}")
            )
        ).session.session_id
        for i in range(THREADS)
    ]

    def append(index: int, n: int) -> int:
        request = spb.AppendEventsRequest(
            agent="main", session_id=sessions[index], events=[user_message(f"m-{index}-{n}")]
        )
        # The channel of now: a SIGKILLed service comes back on another port.
        stub_now = spb_grpc.SessionServiceStub(service.channel)
        return stub_now.AppendEvents(request, timeout=5).events[0].sequence

    return append


def _recorder(service: Service) -> Callable[[int, int], str]:
    def register() -> str:
        stub = dpb_grpc.DeliveryServiceStub(service.channel)
        request = dpb.RegisterInstanceRequest(
            gateway_name="chaos", host="h", pid=1, platforms=["slack"]
        )
        return stub.RegisterInstance(request, timeout=5).instance.instance_id

    instance = register()

    def record(index: int, n: int) -> str:
        request = dpb.RecordObligationRequest(
            instance_id=instance,
            content="answer",
            session_key=f"agent:main:slack:channel:C{index}",
            message_ref=f"m-{index}-{n}-{time.monotonic_ns()}",
            platform="slack",
            chat_id=f"C{index}",
        )
        stub = dpb_grpc.DeliveryServiceStub(service.channel)
        return stub.RecordObligation(request, timeout=5).obligation.id

    return record


def _fault(
    kind: str,
    rng: random.Random,
    db: PrivateDatabase,
    processes: Processes,
    services: dict[str, Service],
) -> None:
    if kind == "terminate":
        db.terminate_backends()
    elif kind == "outage":
        db.refuse_connections()
        time.sleep(rng.uniform(1.0, 3.0))
        db.refuse_connections(False)
    else:
        services[kind.removeprefix("kill-")].restart(processes, db.url)


def test_database_faults_and_process_kills(processes: Processes) -> None:
    reason = postgres_unreachable_reason()
    if reason:
        pytest.skip(reason)
    rng = seeded("test_database_faults_and_process_kills")
    recoveries: dict[str, list[float]] = defaultdict(list)
    with private_database() as db:
        services = {
            "session": _start(processes, db.url, "session"),
            "delivery": _start(processes, db.url, "delivery"),
        }
        killed_any = False
        with (
            Load(_appender(services["session"]), threads=THREADS) as appends,
            Load(_recorder(services["delivery"]), threads=THREADS) as obligations,
        ):
            for _ in range(ROUNDS * 2):
                _await_progress(appends, obligations)
                time.sleep(rng.uniform(0.05, 0.5))
                kind = rng.choice(FAULTS)
                killed_any |= kind.startswith("kill-")
                _fault(kind, rng, db, processes, services)
                ended = time.monotonic()
                recoveries[kind].append(
                    max(appends.wait_for_ok_after(ended), obligations.wait_for_ok_after(ended))
                )
        for service in services.values():
            service.close()
        allowed = {"OK", "UNAVAILABLE"} | ({"DEADLINE_EXCEEDED"} if killed_any else set())
        summary = ", ".join(
            f"{kind} x{len(times)}: median {statistics.median(times):.3f} s, max {max(times):.3f} s"
            for kind, times in sorted(recoveries.items())
        )
        print(
            f"database chaos, {ROUNDS * 2} faults: recovery {summary}; "
            f"appends {dict(appends.codes)}, obligations {dict(obligations.codes)}"
        )
        for load in (appends, obligations):
            assert set(load.codes) <= allowed, load.codes
        _assert_everything_kept(db, appends, obligations)


def _await_progress(*loads: Load) -> None:
    """Until each load has had a few more calls acknowledged."""
    targets = [(load, load.ok_count() + 5) for load in loads]
    wait_for(
        lambda: all(load.ok_count() >= target for load, target in targets),
        30,
        "calls between faults",
    )


def _assert_everything_kept(db: PrivateDatabase, appends: Load, obligations: Load) -> None:
    head, events = session_log(db.url)
    assert_gap_free(head, events)
    logged = {event.sequence for event in events}
    lost: list[Any] = [seq for seq in appends.acknowledged if seq not in logged]
    assert not lost, f"acknowledged appends lost: {lost[:10]}"
    stored = {row[0] for row in db.sql("SELECT id FROM ledger_obligation")}
    lost = [oid for oid in obligations.acknowledged if oid not in stored]
    assert not lost, f"acknowledged obligations lost: {lost[:10]}"
