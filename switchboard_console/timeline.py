"""The timeline's picture of one window of the log, laid out on the server.

The x-axis is the global sequence; one lane per agent (its sessions in lanes of
their own when expanded), a lane for the log's own records (rewinds, operators'
actions); every rewind a full-height marker, the interval it abandoned hatched
across every lane; checkpoints as flags. Everything here is arithmetic on the one
window the page read: nothing grows with the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Events a window holds (one ListLogEvents page).
WINDOW_EVENTS = 500
#: Room left right of the head while following it, for live events (in sequences).
LIVE_ROOM_MIN = 20

WIDTH = 1200
LABEL_WIDTH = 190
RIGHT_MARGIN = 16
TOP = 34  # room for checkpoint flags
LANE_HEIGHT = 26
LOG_LANE = ""  # the lane of the log's own records


@dataclass(frozen=True)
class Lane:
    key: str  # "agent" or "agent/session"; LOG_LANE for the log's records
    label: str
    y: float
    agent: str
    session: str = ""
    expandable: bool = False
    expanded: bool = False


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    seq: int
    group: str
    kind: str
    text: str
    abandoned: bool


@dataclass(frozen=True)
class Hatch:
    x: float
    width: float
    first: int  # the first abandoned sequence
    last: int  # the last abandoned sequence
    rewind: int  # the record that abandoned it (0: one outside this window)


@dataclass(frozen=True)
class Marker:
    x: float
    seq: int
    to: int
    checkout: bool
    abandoned: bool


@dataclass(frozen=True)
class Flag:
    x: float
    seq: int
    label: str


@dataclass
class Picture:
    low: int
    high: int  # the last sequence of the axis (room for live events when following)
    lanes: list[Lane] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    hatches: list[Hatch] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    height: float = 0.0
    ticks: list[tuple[float, int]] = field(default_factory=list)

    @property
    def x0(self) -> float:
        return LABEL_WIDTH

    @property
    def x1(self) -> float:
        return WIDTH - RIGHT_MARGIN

    def x(self, seq: float) -> float:
        span = max(1, self.high - self.low)
        return round(self.x0 + (seq - self.low) / span * (self.x1 - self.x0), 2)


def axis(first: int, last: int, head: int, following: bool) -> tuple[int, int]:
    """The axis of a window holding events `first`..`last`: when following the head,
    room to its right for the live events to come."""
    low = max(0, first - 1) if first else max(0, head - 1)
    high = max(last, low + 1)
    if following:
        high = max(high, head) + max(LIVE_ROOM_MIN, (high - low) // 5)
    return low, high


def lay_out(
    summaries: Sequence[dict[str, Any]],
    checkpoints: Iterable[tuple[str, int]],
    *,
    head: int,
    following: bool,
    expanded: frozenset[str] = frozenset(),
) -> Picture:
    first = summaries[0]["seq"] if summaries else 0
    last = summaries[-1]["seq"] if summaries else 0
    low, high = axis(first, last, head, following)
    picture = Picture(low=low, high=high)
    lanes = _lanes(summaries, expanded)
    picture.lanes = lanes
    picture.height = TOP + LANE_HEIGHT * len(lanes) + 22
    by_key = {lane.key: lane for lane in lanes}
    for summary in summaries:
        lane = by_key[_lane_key(summary, expanded)]
        picture.marks.append(
            Mark(
                x=picture.x(summary["seq"]),
                y=lane.y,
                seq=summary["seq"],
                group=summary["group"],
                kind=summary["kind"],
                text=f"{summary['seq']} · {summary['text']}",
                abandoned=summary["abandoned"],
            )
        )
    picture.markers = [
        Marker(picture.x(s["seq"]), s["seq"], s["to"], s["checkout"], s["abandoned"])
        for s in summaries
        if s["kind"] == "rewound"
    ]
    picture.hatches = _hatches(picture, summaries)
    picture.flags = [
        Flag(picture.x(seq), seq, label) for label, seq in checkpoints if low <= seq <= high
    ]
    picture.ticks = _ticks(picture)
    return picture


def _lane_key(summary: dict[str, Any], expanded: frozenset[str]) -> str:
    agent = str(summary["agent"])
    if not agent:
        return LOG_LANE
    if agent in expanded:
        return f"{agent}/{summary['session']}"
    return agent


def _lanes(summaries: Sequence[dict[str, Any]], expanded: frozenset[str]) -> list[Lane]:
    agents = sorted({s["agent"] for s in summaries if s["agent"]})
    rows: list[tuple[str, str, str, str]] = [(LOG_LANE, "log records", "", "")]
    for agent in agents:
        rows.append((agent, agent, agent, ""))
        if agent in expanded:
            sessions = sorted({s["session"] for s in summaries if s["agent"] == agent})
            rows += [
                (f"{agent}/{session}", session or "(agent's own)", agent, session)
                for session in sessions
            ]
    lanes = []
    for number, (key, label, agent, session) in enumerate(rows):
        is_agent_row = bool(agent) and not session and key == agent
        lanes.append(
            Lane(
                key=key,
                label=label,
                y=TOP + LANE_HEIGHT * number + LANE_HEIGHT / 2,
                agent=agent,
                session=session,
                expandable=is_agent_row,
                expanded=is_agent_row and agent in expanded,
            )
        )
    return lanes


def _hatches(picture: Picture, summaries: Sequence[dict[str, Any]]) -> list[Hatch]:
    """Each counting rewind's abandoned interval, and any run of abandoned events a
    rewind outside the window abandoned."""
    hatches: list[Hatch] = []
    covered: list[tuple[int, int]] = []
    for summary in summaries:
        if summary["kind"] != "rewound" or summary["abandoned"]:
            continue
        first, last = max(summary["to"] + 1, picture.low), summary["seq"] - 1
        if first <= last:
            hatches.append(_hatch(picture, first, last, summary["seq"]))
            covered.append((first, last))
    for run in _abandoned_runs(summaries):
        if not any(low <= run[0] and run[-1] <= high for low, high in covered):
            hatches.append(_hatch(picture, run[0], run[-1], 0))
    return hatches


def _abandoned_runs(summaries: Sequence[dict[str, Any]]) -> list[list[int]]:
    """The sequences of consecutive abandoned events, run by run."""
    runs: list[list[int]] = [[]]
    for summary in summaries:
        if summary["abandoned"]:
            runs[-1].append(summary["seq"])
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


def _hatch(picture: Picture, first: int, last: int, rewind: int) -> Hatch:
    left, right = picture.x(first - 0.5), picture.x(last + 0.5)
    return Hatch(x=left, width=max(1.0, right - left), first=first, last=last, rewind=rewind)


def _ticks(picture: Picture, count: int = 6) -> list[tuple[float, int]]:
    span = picture.high - picture.low
    step = max(1, span // count)
    return [(picture.x(seq), seq) for seq in range(picture.low, picture.high + 1, step)]
