"""One measurement's numbers and how they are summarised."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: RPCs (or raw transactions) per delivery cycle: record, attempting, delivered.
STEPS_PER_CYCLE = 3


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values; NaN for none."""
    if not sorted_values:
        return math.nan
    rank = math.ceil(fraction * len(sorted_values))
    return sorted_values[min(max(rank, 1), len(sorted_values)) - 1]


@dataclass
class Measurement:
    """Cycles completed inside a measurement window, and their latencies."""

    name: str
    clients: int
    window_s: float
    cycles: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int = 0
    channels: int = 0
    rpcs_per_cycle: float = STEPS_PER_CYCLE
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
    """A measurement from per-cycle latencies (seconds) and the completed count."""
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


def timed_loop(
    name: str, operation: Callable[[int], None], seconds: float, warmup_s: float
) -> Measurement:
    """Runs `operation(i)` back to back in this thread for warmup + seconds and measures
    the last `seconds`: an operation counts if it ends inside the window, its latency
    if it also began there (the floors' and the in-process peers' one loop)."""
    latencies: list[float] = []
    measure_from = time.perf_counter() + warmup_s
    stop_at = measure_from + seconds
    completed = 0
    i = 0
    while (began := time.perf_counter()) < stop_at:
        operation(i)
        ended = time.perf_counter()
        i += 1
        if ended > stop_at:
            break
        if began >= measure_from:
            latencies.append(ended - began)
        if ended >= measure_from:
            completed += 1
    return summarise(name, 1, seconds, latencies, completed)
