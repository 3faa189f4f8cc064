"""What a run of `python -m bench` asks of a section, and what a section gives back.

A section (`bench.throughput`, `bench.claim`, ...) is a function of a `Context` (how
long to measure, on which backends, where to say what it does) returning a `Section`:
its tables, its JSON, the figures it contributes to the goal lines and notes.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench.peers.goals import Side
from bench.servers import BACKENDS, Backend
from bench.stats import Measurement

T = TypeVar("T")


@dataclass(frozen=True)
class Scale:
    """How much a run measures: `full` (the figures of record), `quick` (a few minutes),
    `smoke` (a few hundred operations per measurement: proves the benchmark runs, its
    figures mean nothing)."""

    name: str
    seconds: float
    warmup_s: float

    def pick(self, full: T, quick: T, smoke: T) -> T:
        return {"full": full, "quick": quick, "smoke": smoke}[self.name]


SCALES = {
    "full": Scale("full", 10.0, 2.0),
    "quick": Scale("quick", 3.0, 1.0),
    "smoke": Scale("smoke", 0.4, 0.1),
}

_STARTED = time.monotonic()


def progress(message: str) -> None:
    """A progress line on stderr, with the seconds since this process started."""
    print(f"[{time.monotonic() - _STARTED:6.0f} s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Context:
    scale: Scale
    #: The backends selected; Postgres only when it answers.
    backends: Sequence[Backend] = BACKENDS
    #: Why Postgres is not in `backends` although selected, or None.
    postgres_reason: str | None = None
    say: Callable[[str], None] = progress

    def missing(self, backend_key: str) -> str:
        """Why `backend_key` has no figures in this run."""
        if backend_key == "postgres" and self.postgres_reason is not None:
            return f"skipped (postgres: {self.postgres_reason})"
        return f"not measured ({backend_key} not selected)"

    def backend(self, key: str) -> Backend | None:
        return next((b for b in self.backends if b.key == key), None)


@dataclass
class Section:
    """What a section measured: `text` (its tables) under `title`, `data` for the JSON
    report and the plots, `sides` for the goal lines, `notes` (errors, skips)."""

    key: str
    title: str
    text: str
    data: dict[str, Any]
    sides: dict[str, Side] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def error_notes(label: str, measurements: Sequence[Measurement]) -> list[str]:
    """A note for every measurement that had errors."""
    return [
        f"{label} {m.name}, {m.clients} client(s): {m.errors} error(s), first: "
        f"{m.extra.get('first_error', '')}"
        for m in measurements
        if m.errors
    ]
