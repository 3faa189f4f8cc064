"""The goal lines of issue 15: each Switchboard figure against a peer or floor measured in
the same run, its ratio, and MET / NOT MET; and the targets set for this machine, judged
the same way against fixed figures. Pure functions of the figures, so the wording and
the verdicts are tested on fixed inputs (tests/test_bench_peers.py).

A figure is a `Side`: a value (a rate per second, or a latency in ms or s) or the
reason there is none ("skipped (pip install -e '.[bench]')", "not measured
(sessions not selected)"). A goal with a missing side prints that
reason instead of a verdict; a Switchboard figure with errors is NOT MET.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.peers.common import PeerResult


@dataclass(frozen=True)
class Side:
    """One figure of a goal line: `value` in `unit`, or `missing` saying why not."""

    name: str
    value: float | None = None
    unit: str = "/s"
    missing: str = ""
    errors: int = 0

    def text(self) -> str:
        if self.value is None:
            return f"{self.name}: {self.missing}"
        if self.unit == "ms":
            return f"{self.value:,.2f} ms"
        if self.unit == "s":
            return f"{self.value:,.3f} s"
        return f"{self.value:,.0f}{self.unit}"


@dataclass(frozen=True)
class Goal:
    """`ours` compared with `theirs`: MET when ours / theirs is >= (or <=) `factor`."""

    text: str
    ours: str  # key of a Side
    theirs: str  # key of a Side
    factor: float
    at_least: bool = True  # False: ours / theirs must be <= factor (latencies)


GOALS = (
    Goal(
        "AppendEvents at 8 clients >= 1.0x OpenAI Agents SQLiteSession.add_items in-process",
        "appends-8",
        "openai-agents",
        1.0,
    ),
    Goal("AppendEvents at 1 client >= 10x ADK append_event", "appends-1", "adk-append", 10.0),
    Goal(
        "Delivery send path at 8 clients >= 0.8x the raw sqlite3 floor (SQLite FULL)",
        "delivery-8-sqlite",
        "delivery-floor-sqlite",
        0.8,
    ),
    Goal(
        "Delivery send path on Postgres at 8 clients >= 0.8x the psycopg2 floor",
        "delivery-8-postgres",
        "delivery-floor-postgres",
        0.8,
    ),
    Goal(
        "Delivery send path on Postgres at 8 clients >= 2x a procrastinate job cycle",
        "delivery-8-postgres",
        "procrastinate",
        2.0,
    ),
    Goal(
        "Load-for-next-turn at 1,000 events <= 1/10 of ADK get_session at 1,000 events",
        "turn-1000",
        "adk-get-session",
        0.1,
        at_least=False,
    ),
)

#: The goals of issue 25 (group commit, the gateway stream, record-and-begin): the writes
#: as a gateway with 8 calls in flight sends them, over CallStream, against the same peers
#: and floors. (Its latency goals compare with earlier runs: docs/performance.md.)
GOALS_25 = (
    Goal(
        "AppendEvents at 8 clients over CallStream (SQLite FULL) >= 1.0x OpenAI Agents "
        "SQLiteSession.add_items in-process",
        "appends-8-stream",
        "openai-agents",
        1.0,
    ),
    Goal(
        "AppendEvents at 1 client >= 1.5x the faster of ADK's session services",
        "appends-1",
        "adk-append",
        1.5,
    ),
    Goal(
        "AppendEvents at 8 clients over CallStream on Postgres >= 1.0x the peewee insert floor",
        "appends-8-stream-postgres",
        "appends-floor-postgres",
        1.0,
    ),
    Goal(
        "Delivery cycle at 8 clients (record-and-begin over CallStream, SQLite FULL) >= 0.8x "
        "the raw sqlite3 floor",
        "delivery-8-stream-sqlite",
        "delivery-floor-sqlite",
        0.8,
    ),
    Goal(
        "Delivery cycle at 8 clients (record-and-begin over CallStream) on Postgres >= 1.0x "
        "the psycopg2 floor",
        "delivery-8-stream-postgres",
        "delivery-floor-postgres",
        1.0,
    ),
    Goal(
        "Delivery cycle at 8 clients (record-and-begin over CallStream) on Postgres >= 2x "
        "a procrastinate job cycle",
        "delivery-8-stream-postgres",
        "procrastinate",
        2.0,
    ),
)

#: The absolute targets set for this machine (docs/performance.md, "The goals"): each
#: figure against a fixed value, judged like the goals above.
TARGETS = (
    Goal(
        "Delivery send path at 8 clients >= 1,500 cycles/s (SQLite FULL)",
        "delivery-8-sqlite",
        "target-delivery-8",
        1.0,
    ),
    Goal(
        "AppendEvents at 8 clients >= 2,500/s (SQLite FULL)", "appends-8", "target-appends-8", 1.0
    ),
    Goal(
        "Load-for-next-turn at 1,000 events <= 3 ms (p50, SQLite FULL)",
        "turn-1000",
        "target-turn-1000",
        1.0,
        at_least=False,
    ),
    Goal(
        "Global rewind of 100k events in 1,000 sessions < 2 s",
        "rewind-100k",
        "target-rewind-100k",
        1.0,
        at_least=False,
    ),
    Goal(
        "Restart on a log of 1M events < 10 s",
        "restart-1m",
        "target-restart-1m",
        1.0,
        at_least=False,
    ),
)
TARGET_SIDES = {
    "target-delivery-8": Side("target", 1500.0),
    "target-appends-8": Side("target", 2500.0),
    "target-turn-1000": Side("target", 3.0, "ms"),
    "target-rewind-100k": Side("target", 2.0, "s"),
    "target-restart-1m": Side("target", 10.0, "s"),
}


@dataclass(frozen=True)
class Verdict:
    goal: Goal
    ours: Side
    theirs: Side
    ratio: float | None
    met: bool | None  # None: not measured or skipped

    @property
    def line(self) -> str:
        head = f"goal: {self.goal.text}"
        reasons = [side.missing for side in (self.ours, self.theirs) if side.value is None]
        if reasons:
            return f"{head}: {'; '.join(dict.fromkeys(reasons))}"
        assert self.ratio is not None
        verdict = "MET" if self.met else "NOT MET"
        errors = f", {self.ours.errors} error(s)" if self.ours.errors else ""
        return (
            f"{head}: {verdict} ({self.ratio:.2f}x: {self.ours.name} {self.ours.text()} "
            f"vs {self.theirs.name} {self.theirs.text()}{errors})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "goal": self.goal.text,
            "ours": self.ours.value,
            "theirs": self.theirs.value,
            "ratio": self.ratio,
            "met": self.met,
            "line": self.line,
        }


def judge(goal: Goal, ours: Side, theirs: Side) -> Verdict:
    if ours.value is None or theirs.value is None or theirs.value <= 0:
        if theirs.value is not None and theirs.value <= 0:
            theirs = Side(theirs.name, None, theirs.unit, "not measured (zero figure)")
        return Verdict(goal, ours, theirs, None, None)
    ratio = ours.value / theirs.value
    within = ratio >= goal.factor if goal.at_least else ratio <= goal.factor
    return Verdict(goal, ours, theirs, ratio, within and not ours.errors)


def judge_all(sides: Mapping[str, Side], goals: Sequence[Goal] = GOALS) -> list[Verdict]:
    """Every goal; a key absent from `sides` reads as not measured."""

    def side(key: str) -> Side:
        return sides.get(key) or Side(key, missing="not measured")

    return [judge(goal, side(goal.ours), side(goal.theirs)) for goal in goals]


# -- the peers' sides ---------------------------------------------------------------------------

#: Goal side -> the peer figures it may take, the best of them (stricter for Switchboard).
PEER_SIDES = {
    "openai-agents": ("openai-agents-add-items-1", "openai-agents-add-items-8"),
    "adk-append": ("adk-database-append", "adk-sqlite-append"),
    "adk-get-session": ("adk-database-get-session", "adk-sqlite-get-session"),
    "procrastinate": ("procrastinate-job-cycle",),
}


def peer_sides(results: Sequence[PeerResult]) -> dict[str, Side]:
    """Each peer side from its best measured figure: the highest rate, the lowest latency.

    With none measured, the side carries the first figure's skip reason.
    """
    by_key = {result.key: result for result in results}
    sides: dict[str, Side] = {}
    for side, keys in PEER_SIDES.items():
        found = [by_key[key] for key in keys if key in by_key]
        measured = [r for r in found if r.value is not None]
        if not measured:
            reason = found[0].skipped if found else "not measured (peers not selected)"
            sides[side] = Side(side, missing=reason or "not measured")
            continue
        if measured[0].kind == "latency":
            best = min(measured, key=lambda r: r.value or 0.0)
            sides[side] = Side(best.label, best.value, "ms")
        else:
            best = max(measured, key=lambda r: r.value or 0.0)
            sides[side] = Side(best.label, best.value, "/s")
    return sides
