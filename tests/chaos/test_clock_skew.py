"""A replica whose host clock is 10 minutes off neither steals live rows nor keeps
dead ones: on Postgres, leases and cutoffs are judged on the database's clock.

The skewed replica is a real `switchboard serve delivery` process run under
libfaketime (FAKETIME=±10m; the monotonic clock is left alone). A live gateway
heartbeats through a normal replica; a dead gateway's lease runs out on the
database clock. A +10 min replica judging by its own clock would see the live
lease as expired (and every row as stale); a -10 min one would still see the
dead lease as live, and its own fresh registration as long expired.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import grpc
import pytest
from google.protobuf import duration_pb2

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from tests.chaos.common import DEADLINE, Processes, channel_to, seeded, sql, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE, pytest.mark.postgres]

LEASE_TTL_S = 2.0
SKEW_S = 600.0
TIMEOUT_S = 10.0
#: Replicas drop rows older than this; a +10 min clock would call every row stale.
STALE_AFTER_S = 300


def _libfaketime() -> str | None:
    for pattern in (
        "/usr/lib/*/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
        "/usr/lib64/faketime/libfaketime.so.1",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def _skewed_environment(offset: str) -> dict[str, str]:
    """The environment of a process whose wall clock is `offset` ("+10m") off; skips the
    test when libfaketime is missing or has no effect here."""
    library = _libfaketime()
    if library is None:
        _cannot_skew(
            "libfaketime is not installed (apt-get install faketime), so no replica "
            "can be run with a skewed clock"
        )
    env = {"LD_PRELOAD": library, "FAKETIME": offset, "DONT_FAKE_MONOTONIC": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    expected = SKEW_S if offset.startswith("+") else -SKEW_S
    try:
        measured = float(probe.stdout) - time.time()
    except ValueError:
        measured = 0.0
    if abs(measured - expected) > 30:
        _cannot_skew(f"libfaketime at {library} did not skew the clock ({measured:+.0f} s)")
    return env


def _cannot_skew(why: str) -> NoReturn:
    if os.environ.get("SWITCHBOARD_REQUIRE_FAKETIME"):
        pytest.fail(why)  # CI: .ci/run installs libfaketime
    pytest.skip(why)


def _duration(seconds: float) -> duration_pb2.Duration:
    value = duration_pb2.Duration()
    value.FromNanoseconds(int(seconds * 1e9))
    return value


def _register(
    stub: dpb_grpc.DeliveryServiceStub, name: str, lease_ttl_s: float | None = None
) -> str:
    # One bot's instances (only they claim its rows); the name tells them apart.
    request = dpb.RegisterInstanceRequest(gateway_name="skew", host=name, platforms=["slack"])
    if lease_ttl_s is not None:
        request.lease_ttl.CopyFrom(_duration(lease_ttl_s))
    return str(stub.RegisterInstance(request, timeout=TIMEOUT_S).instance.instance_id)


@contextmanager
def _heartbeating(stub: dpb_grpc.DeliveryServiceStub, instance_id: str) -> Iterator[list[str]]:
    """Heartbeats every 0.3 s while the block runs; yields the errors it met."""
    stop = threading.Event()
    errors: list[str] = []

    def beat() -> None:
        while not stop.wait(0.3):
            try:
                stub.Heartbeat(
                    dpb.HeartbeatRequest(instance_id=instance_id, platforms=["slack"]),
                    timeout=TIMEOUT_S,
                )
            except grpc.RpcError as error:
                errors.append(str(error))

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        yield errors
    finally:
        stop.set()
        thread.join(timeout=TIMEOUT_S)


def _record(
    stub: dpb_grpc.DeliveryServiceStub, instance_id: str, tag: str, n: int
) -> dpb.Obligation:
    request = dpb.RecordObligationRequest(
        instance_id=instance_id,
        session_key=f"agent:main:slack:dm:{tag}",
        message_ref=f"{tag}-{n}",
        content=f"reply {tag} {n}",
        platform="slack",
        chat_id=tag,
        begin_attempt=n % 2 == 0,  # ATTEMPTING and PENDING rows alike
    )
    return stub.RecordObligation(request, timeout=TIMEOUT_S).obligation


def _database_now(url: str) -> float:
    return float(sql(url, "SELECT extract(epoch from clock_timestamp())")[0][0])


def _expired_on_database_clock(url: str, instance_id: str) -> bool:
    [(expired,)] = sql(
        url,
        "SELECT lease_expires_at < extract(epoch from clock_timestamp()) "
        "FROM ledger_instance WHERE id = ?",
        [instance_id],
    )
    return bool(expired)


@pytest.mark.parametrize("offset", ["+10m", "-10m"])
def test_a_skewed_replica_neither_steals_live_rows_nor_keeps_dead_ones(
    postgres_url: str, processes: Processes, offset: str
) -> None:
    seeded(f"clock skew {offset}")  # deterministic; printed for the record
    env = _skewed_environment(offset)
    flags = ("--lease-ttl", str(LEASE_TTL_S), "--stale-after", str(STALE_AFTER_S))
    normal = processes.server(postgres_url, *flags)
    skewed = processes.server(postgres_url, *flags, env=env)
    with channel_to(normal.address) as normal_channel, channel_to(skewed.address) as skew_channel:
        through_normal = dpb_grpc.DeliveryServiceStub(normal_channel)
        through_skewed = dpb_grpc.DeliveryServiceStub(skew_channel)

        live = _register(through_normal, "live")  # the server's 2 s lease, kept by heartbeats
        dead = _register(through_normal, "dead", lease_ttl_s=LEASE_TTL_S)  # never heartbeats
        # Registered and kept alive through the skewed replica: a -10 min clock would
        # hand out leases that expired ten minutes ago.
        claimer = _register(through_skewed, "claimer")
        with (
            _heartbeating(through_normal, live) as live_errors,
            _heartbeating(through_skewed, claimer) as claimer_errors,
        ):
            live_rows = {_record(through_normal, live, "live", n).id for n in range(4)}
            dead_rows = {_record(through_normal, dead, "dead", n).id for n in range(4)}
            # A row recorded through the skewed replica carries the database's time.
            through_it = _record(through_skewed, live, "live-via-skewed", 0)
            live_rows.add(through_it.id)
            created = through_it.create_time.ToNanoseconds() / 1e9
            assert abs(created - _database_now(postgres_url)) < 5, "stamped with the host clock"

            early = _claim(through_skewed, claimer)
            assert (len(early.obligations), early.abandoned_count) == (0, 0), (
                "the skewed replica claimed (or abandoned) rows of live leases"
            )

            wait_for(
                lambda: _expired_on_database_clock(postgres_url, dead),
                LEASE_TTL_S + 10,
                "the dead gateway's lease to run out on the database clock",
            )
            late = _claim(through_skewed, claimer)
            assert late.abandoned_count == 0, "fresh rows abandoned as stale"
            assert {row.id for row in late.obligations} == dead_rows, (
                "the skewed replica did not claim exactly the dead gateway's rows"
            )
            for row in late.obligations:
                through_skewed.MarkDelivered(
                    dpb.MarkDeliveredRequest(
                        obligation_id=row.id, instance_id=claimer, fence=row.fence
                    ),
                    timeout=TIMEOUT_S,
                )
            stats = through_skewed.GetLedgerStats(dpb.GetLedgerStatsRequest(), timeout=TIMEOUT_S)
            assert stats.live_instance_count == 2, "live: the heartbeating gateway and claimer"
            assert not live_errors and not claimer_errors, (live_errors, claimer_errors)
        for row_id in live_rows:
            row = through_normal.GetObligation(
                dpb.GetObligationRequest(obligation_id=row_id), timeout=TIMEOUT_S
            ).obligation
            assert (row.owner_instance_id, row.fence, row.attempts) == (live, 1, 0), row
    print(
        f"clock skew {offset}: 0 of {len(live_rows)} live rows claimed, "
        f"{len(dead_rows)} of {len(dead_rows)} dead rows claimed, 0 abandoned"
    )


def _claim(stub: dpb_grpc.DeliveryServiceStub, instance_id: str) -> dpb.ClaimRecoverableResponse:
    request = dpb.ClaimRecoverableRequest(instance_id=instance_id, limit=1000)
    return stub.ClaimRecoverable(request, timeout=TIMEOUT_S)
