"""SQLite's "now": a clock that does not jump when someone steps the wall clock.

SQLite has no server whose clock replicas could share, and the host's wall
clock can be stepped (NTP, an operator, a VM restored from a snapshot): a +2 h
step made live leases look expired, +25 h made fresh replies look stale. So the
backend's `now()` is the wall time at an *anchor* plus the time elapsed since,
measured on `CLOCK_BOOTTIME` (monotonic, counting suspend; never stepped).

The anchor lives in the database file, one row: the kernel's boot id, the
boot clock and the wall time when it was taken. Every process on the same host
and boot reads the same boot clock, so all replicas on the file compute the
same `now()`. After a reboot (another boot id) the boot clock restarts, so the
first process re-anchors at the wall time of that moment, never earlier than
the previous anchor: across reboots the clock falls back to wall time.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import peewee

from switchboard.database import bind_model

log = logging.getLogger(__name__)

BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
#: A wall clock this far from the anchored clock at start-up is reported.
DRIFT_WARNING_S = 10.0


def boot_id() -> str | None:
    """This boot's id (Linux), or None where the kernel does not say."""
    try:
        return BOOT_ID_FILE.read_text().strip() or None
    except OSError:
        return None


def since_boot() -> float:
    """Seconds on the boot clock: shared by every process of this boot, never stepped."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


class ClockAnchorRow(peewee.Model):
    id = peewee.IntegerField(primary_key=True)  # always 1: one anchor per database
    boot_id = peewee.CharField(max_length=64)
    boot_clock = peewee.DoubleField()
    wall = peewee.DoubleField()

    class Meta:
        table_name = "switchboard_clock_anchor"


@dataclass(frozen=True)
class AnchoredClock:
    """`wall` seconds since the epoch at `boot_clock` on this boot's clock."""

    wall: float
    boot_clock: float

    def now(self) -> float:
        return self.wall + (since_boot() - self.boot_clock)


class WallClock:
    """The plain wall clock, where there is no boot id to anchor on."""

    def now(self) -> float:
        return time.time()


def anchored_clock(database: peewee.SqliteDatabase, path: str) -> AnchoredClock | WallClock:
    """Reads this boot's anchor from the database, taking it first if there is none.

    Runs in an IMMEDIATE transaction, so replicas starting together agree on one
    anchor: the first takes it, the others read it.
    """
    boot = boot_id()
    if boot is None:
        log.warning("no boot id on this host: the SQLite backend uses the wall clock")
        return WallClock()
    model: Any = bind_model(ClockAnchorRow, database)
    database.create_tables([model], safe=True)
    with database.atomic("IMMEDIATE"):
        row = model.get_or_none(model.id == 1)
        boot_now, wall_now = since_boot(), time.time()
        if row is not None and row.boot_id == boot and row.boot_clock <= boot_now:
            clock = AnchoredClock(wall=row.wall, boot_clock=row.boot_clock)
        else:
            clock = _reanchor(model, row, boot, boot_now, wall_now, path)
    drift = wall_now - clock.now()
    if abs(drift) > DRIFT_WARNING_S:
        log.warning(
            "the host's wall clock is %.0f s %s the clock leases and timestamps of %s use "
            "(the wall clock was stepped since the anchor was taken at this boot's first "
            "start); they keep following the anchored clock until the host reboots",
            abs(drift),
            "ahead of" if drift > 0 else "behind",
            path,
        )
    return clock


def _reanchor(
    model: Any, row: Any, boot: str, boot_now: float, wall_now: float, path: str
) -> AnchoredClock:
    """A new anchor at the wall time now, but never before the previous anchor."""
    wall = wall_now
    if row is not None and row.wall > wall_now:
        log.warning(
            "the host's wall clock is %.0f s behind the previous clock anchor of %s: "
            "the clock starts at that anchor instead, so it never runs backwards",
            row.wall - wall_now,
            path,
        )
        wall = row.wall
    model.insert(id=1, boot_id=boot, boot_clock=boot_now, wall=wall).on_conflict(
        conflict_target=[model.id],
        update={model.boot_id: boot, model.boot_clock: boot_now, model.wall: wall},
    ).execute()
    log.info("clock of %s anchored at this boot (%s)", path, boot)
    return AnchoredClock(wall=wall, boot_clock=boot_now)
