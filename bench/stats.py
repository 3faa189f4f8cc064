"""One measurement's numbers: the window they were counted in, and how they are summarised.

Every closed loop of the benchmarks (the load generator's clients, the in-process
floors, the peers) counts through `Window`, so the rules are the same everywhere:
the first `warmup_s` are not counted; an operation counts when it ends inside the
window, its latency when it also began there.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values; NaN for none."""
    if not sorted_values:
        return math.nan
    rank = math.ceil(fraction * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


@dataclass
class Measurement:
    """Operations (`cycles`) completed inside a measurement window, and their latencies.

    An operation is what a workload repeats: one append, one delivery cycle (3 RPCs),
    one next-turn load (2 RPCs); for a claim, one claimed row."""

    name: str
    clients: int
    window_s: float
    cycles: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int = 0
    channels: int = 0
    rpcs_per_cycle: float = 1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cycles_per_s(self) -> float:
        return self.cycles / self.window_s if self.window_s > 0 else 0.0

    @property
    def rpcs_per_s(self) -> float:
        return self.cycles_per_s * self.rpcs_per_cycle

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cycles_per_s"] = round(self.cycles_per_s, 1)
        data["rpcs_per_s"] = round(self.rpcs_per_s, 1)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        known = {name for name in cls.__dataclass_fields__}
        return cls(**{key: value for key, value in data.items() if key in known})


def summarise(
    name: str,
    clients: int,
    window_s: float,
    latencies_s: Sequence[float],
    completed: int,
    errors: int = 0,
    channels: int = 0,
) -> Measurement:
    """A measurement from per-operation latencies (seconds) and the completed count."""
    ordered = sorted(latencies_s)
    mean = sum(ordered) / len(ordered) if ordered else math.nan
    return Measurement(
        name=name,
        clients=clients,
        window_s=window_s,
        cycles=completed,
        p50_ms=percentile(ordered, 0.50) * 1000,
        p99_ms=percentile(ordered, 0.99) * 1000,
        mean_ms=mean * 1000,
        errors=errors,
        channels=channels,
    )


@dataclass
class Window:
    """A closed loop's measurement window: `warmup_s` from `started`, then `seconds`."""

    warmup_s: float
    seconds: float
    started: float = field(default_factory=time.perf_counter)
    latencies: list[float] = field(default_factory=list)
    completed: int = 0

    @property
    def measure_from(self) -> float:
        return self.started + self.warmup_s

    @property
    def stop_at(self) -> float:
        return self.measure_from + self.seconds

    def open(self) -> bool:
        """Whether an operation may still begin."""
        return time.perf_counter() < self.stop_at

    def record(self, began: float, ended: float, items: int = 1) -> bool:
        """Counts one operation (of `items` items); False once the window has closed."""
        if ended > self.stop_at:
            return False
        if began >= self.measure_from:
            self.latencies.append(ended - began)
        if ended >= self.measure_from:
            self.completed += items
        return True

    def measurement(self, name: str, clients: int = 1, errors: int = 0) -> Measurement:
        return summarise(name, clients, self.seconds, self.latencies, self.completed, errors)


def timed_loop(
    name: str, operation: Callable[[int], None], seconds: float, warmup_s: float
) -> Measurement:
    """Runs `operation(i)` back to back in this thread for warmup + seconds and measures
    the last `seconds` (the floors' and the in-process peers' one loop)."""
    window = Window(warmup_s, seconds)
    i = 0
    while window.open():
        began = time.perf_counter()
        operation(i)
        i += 1
        if not window.record(began, time.perf_counter()):
            break
    return window.measurement(name)


@dataclass(frozen=True)
class ThreadCpu:
    tid: int
    name: str
    cpu_s: float


def thread_cpu(pid: int) -> dict[int, ThreadCpu]:
    """CPU seconds (user + system) of every thread of process `pid`, from /proc; the
    main thread (a server's event loop) is named so."""
    threads: dict[int, ThreadCpu] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for entry in tids:
        try:
            raw = Path(f"/proc/{pid}/task/{entry}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        tid = int(entry)
        threads[tid] = ThreadCpu(tid, "main" if tid == pid else name, ticks / _CLOCK_TICKS)
    return threads


def cpu_delta(before: dict[int, ThreadCpu], after: dict[int, ThreadCpu]) -> list[ThreadCpu]:
    """Per-thread CPU spent between two `thread_cpu` samples, busiest first."""
    spent = [
        ThreadCpu(tid, now.name, now.cpu_s - (before[tid].cpu_s if tid in before else 0.0))
        for tid, now in after.items()
    ]
    return sorted((t for t in spent if t.cpu_s > 0), key=lambda t: -t.cpu_s)
