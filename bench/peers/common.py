"""What every peer module shares: its result, the payload, and the timed loops.

A peer's figure is a `Measurement` (writes per second, or a read's latency) or a
reason it was skipped. Every durable write carries the payload of Switchboard's
AppendEvents benchmark: one USER message of `bench.workloads.MESSAGE_BYTES`
ASCII bytes (`message_content`), so the same bytes reach every store.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bench.stats import Measurement, Window, summarise, timed_loop
from bench.workloads import MESSAGE_BYTES, message_content

#: What a person runs to get the peers (the root pyproject's optional extra).
EXTRA_HINT = "pip install -e '.[bench]'"
SKIPPED_NO_EXTRA = f"skipped ({EXTRA_HINT})"

__all__ = ["EXTRA_HINT", "MESSAGE_BYTES", "SKIPPED_NO_EXTRA", "PeerResult", "message_content"]


@dataclass
class PeerResult:
    """One figure of one peer: measured, or skipped with the reason."""

    key: str  # e.g. "openai-agents-add-items-8"
    label: str  # what was measured, for tables and goal lines
    kind: str  # "rate" (writes/s: Measurement.cycles_per_s) or "latency" (p50 ms)
    measurement: Measurement | None = None
    skipped: str = ""  # "skipped (...)" when there is no measurement
    settings: str = ""  # the storage settings the peer ran with (journal, synchronous, ...)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float | None:
        """The figure goal lines compare: writes/s, or the p50 in ms."""
        if self.measurement is None:
            return None
        if self.kind == "latency":
            return self.measurement.p50_ms
        return self.measurement.cycles_per_s

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "kind": self.kind,
            "value": self.value,
            "measurement": self.measurement.to_json() if self.measurement else None,
            "skipped": self.skipped,
            "settings": self.settings,
            "extra": self.extra,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PeerResult:
        measurement = data.get("measurement")
        return cls(
            key=data["key"],
            label=data["label"],
            kind=data["kind"],
            measurement=Measurement.from_json(measurement) if measurement else None,
            skipped=data.get("skipped", ""),
            settings=data.get("settings", ""),
            extra=data.get("extra", {}),
        )


def user_message(i: int, worker: int = 0) -> str:
    """The benchmark's message number `i` of client `worker` (MESSAGE_BYTES bytes)."""
    return message_content(worker, i)


def sqlite_settings(connection: sqlite3.Connection) -> str:
    """The journal mode and synchronous level a connection really runs with."""
    journal = connection.execute("PRAGMA journal_mode").fetchone()[0]
    level = int(connection.execute("PRAGMA synchronous").fetchone()[0])
    names = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return f"journal_mode={journal}, synchronous={names.get(level, str(level))}"


def timed_sync(
    name: str, operation: Callable[[int], None], seconds: float, warmup_s: float
) -> Measurement:
    """`operation(i)` back to back, one thread, timed by `bench.stats.timed_loop`;
    one durable write per operation."""
    measurement = timed_loop(name, operation, seconds, warmup_s)
    measurement.rpcs_per_cycle = 1
    return measurement


async def timed_async(
    name: str,
    operation: Callable[[int, int], Awaitable[None]],
    workers: int,
    seconds: float,
    warmup_s: float,
) -> Measurement:
    """`workers` closed-loop coroutines each awaiting `operation(worker, i)` back to back,
    counted in one `bench.stats.Window` over all of them."""
    window = Window(warmup_s, seconds)

    async def worker(number: int) -> None:
        i = 0
        while window.open():
            began = time.perf_counter()
            await operation(number, i)
            i += 1
            if not window.record(began, time.perf_counter()):
                return

    await asyncio.gather(*(worker(n) for n in range(workers)))
    measurement = window.measurement(name, workers)
    measurement.rpcs_per_cycle = 1
    return measurement


async def timed_reads(
    name: str, read: Callable[[], Awaitable[None]], repetitions: int, warmup: int
) -> Measurement:
    """`read()` `warmup` times untimed, then `repetitions` times timed (latency figures)."""
    for _ in range(warmup):
        await read()
    latencies: list[float] = []
    started = time.perf_counter()
    for _ in range(repetitions):
        began = time.perf_counter()
        await read()
        latencies.append(time.perf_counter() - began)
    measurement = summarise(
        name, 1, time.perf_counter() - started, latencies, completed=repetitions
    )
    measurement.rpcs_per_cycle = 1
    return measurement
