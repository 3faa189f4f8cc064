"""On SQLite, a replica whose wall clock is stepped +2 h or +25 h neither steals live
rows nor abandons fresh ones: leases and cutoffs are judged on the clock anchored
in the database file (boot clock since an anchor), which wall-clock steps do not move.

Real `switchboard serve delivery` processes share one SQLite file. One runs
under libfaketime reading its offset from a file, so its wall clock is stepped
while it runs (as NTP or an operator would step the host's); a third starts
after the step with the offset already in force. Live gateways heartbeat through
the normal and the stepped replica; a dead one's lease runs out. Judged by its
own wall clock, the stepped replica would see every live lease as expired (+2 h)
and every row as stale (+25 h, past the 24 h cutoff).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.sqlite_clock import boot_id, since_boot
from tests.chaos.common import DEADLINE, Processes, channel_to, seeded, sql, wait_for

# The libfaketime lookup and the gateway moves of the Postgres clock-skew test.
from tests.chaos.test_clock_skew import (
    _cannot_skew,
    _claim,
    _heartbeating,
    _libfaketime,
    _record,
    _register,
)

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

LEASE_TTL_S = 2.0
TIMEOUT_S = 10.0
STEPS = {"+2h": 2 * 3600.0, "+25h": 25 * 3600.0}


def _steppable_environment(offset_file: Path) -> dict[str, str]:
    """libfaketime reading the offset from `offset_file` at every clock read; skips
    (fails in CI) when libfaketime is missing or does not step the clock here."""
    library = _libfaketime()
    if library is None:
        _cannot_skew("libfaketime is not installed (apt-get install faketime)")
    env = {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": str(offset_file),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    offset_file.write_text("+1h\n")
    probe = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    offset_file.write_text("+0\n")
    try:
        measured = float(probe.stdout) - time.time()
    except ValueError:
        measured = 0.0
    if abs(measured - 3600) > 30:
        _cannot_skew(f"libfaketime at {library} did not step the clock ({measured:+.0f} s)")
    return env


def _anchored_now(url: str) -> float:
    """The database's clock as the replicas compute it."""
    [(wall, boot_clock)] = sql(url, "SELECT wall, boot_clock FROM switchboard_clock_anchor")
    return float(wall) + since_boot() - float(boot_clock)


def _expired(url: str, instance_id: str) -> bool:
    [(expires,)] = sql(
        url, "SELECT lease_expires_at FROM ledger_instance WHERE id = ?", [instance_id]
    )
    return float(expires) < _anchored_now(url)


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_stepped_wall_clock_neither_steals_live_rows_nor_abandons_fresh_ones(
    tmp_path: Path, processes: Processes, step: str
) -> None:
    if boot_id() is None:
        pytest.skip("this host has no boot id: SQLite falls back to the wall clock")
    seeded(f"sqlite clock step {step}")
    offset_file = tmp_path / "faketime-offset"
    stepping_env = _steppable_environment(offset_file)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    flags = ("--lease-ttl", str(LEASE_TTL_S))  # the stale cutoff stays at its 24 h
    normal = processes.server(url, *flags)
    stepping = processes.server(url, *flags, env=stepping_env)
    with channel_to(normal.address) as to_normal, channel_to(stepping.address) as to_stepping:
        through_normal = dpb_grpc.DeliveryServiceStub(to_normal)
        through_stepping = dpb_grpc.DeliveryServiceStub(to_stepping)
        live_a = _register(through_normal, "live-a")
        live_b = _register(through_stepping, "live-b")
        dead = _register(through_normal, "dead")  # never heartbeats
        with (
            _heartbeating(through_normal, live_a) as errors_a,
            _heartbeating(through_stepping, live_b) as errors_b,
        ):
            live_rows = {_record(through_normal, live_a, "a", n).id for n in range(5)}
            live_rows |= {_record(through_stepping, live_b, "b", n).id for n in range(5)}
            dead_rows = {_record(through_normal, dead, "dead", n).id for n in range(4)}

            offset_file.write_text(f"{step}\n")  # the stepped replica's wall clock jumps
            wait_for(
                lambda: _expired(url, dead),
                LEASE_TTL_S + 10,
                "the dead gateway's lease to run out on the anchored clock",
            )
            # The first gateway to re-register after the step, through the stepped replica.
            rejoined = _register(through_stepping, "rejoined")
            with _heartbeating(through_stepping, rejoined) as errors_rejoined:
                claimed = _claim(through_stepping, rejoined)
                assert claimed.abandoned_count == 0, "fresh rows abandoned as stale"
                assert {row.id for row in claimed.obligations} == dead_rows, (
                    "the stepped replica did not claim exactly the dead gateway's rows"
                )

                # A replica started after the step, its clock already ahead, reads the anchor.
                late = processes.server(url, *flags, env={**stepping_env, "FAKETIME": step})
                with channel_to(late.address) as to_late:
                    through_late = dpb_grpc.DeliveryServiceStub(to_late)
                    fresh = _record(through_late, live_a, "via-late", 0)
                    live_rows.add(fresh.id)
                    created = fresh.create_time.ToNanoseconds() / 1e9
                    assert abs(created - _anchored_now(url)) < 5, "stamped with the stepped clock"
                    again = _claim(through_late, rejoined)
                    assert (len(again.obligations), again.abandoned_count) == (0, 0), again
                    stats = through_late.GetLedgerStats(
                        dpb.GetLedgerStatsRequest(), timeout=TIMEOUT_S
                    )
                    assert stats.live_instance_count == 3, "live: a, b and the rejoined one"
            assert not errors_a and not errors_b and not errors_rejoined, (
                errors_a,
                errors_b,
                errors_rejoined,
            )
        for row_id in live_rows:
            row = through_normal.GetObligation(
                dpb.GetObligationRequest(obligation_id=row_id), timeout=TIMEOUT_S
            ).obligation
            assert row.owner_instance_id in (live_a, live_b), row
            assert (row.fence, row.attempts) == (1, 0), row
            assert row.state in (dpb.OBLIGATION_STATE_PENDING, dpb.OBLIGATION_STATE_ATTEMPTING)
    print(
        f"sqlite clock step {step}: 0 of {len(live_rows)} live rows claimed, "
        f"{len(dead_rows)} of {len(dead_rows)} dead rows claimed, 0 abandoned"
    )
