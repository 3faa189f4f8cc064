"""Which parts of the log are abandoned: the arithmetic of rewinds.

A rewind (or checkout) record at sequence R with target N abandons the open
interval (N, R): those events stay in the log but are part of no state. Records
resolve latest-first: a record that falls inside an interval of a later
record is itself abandoned and counts for nothing, which is how a later rewind
subsumes an earlier one and how a checkout onto an abandoned branch undoes the
rewinds that abandoned it.

The log stores the outcome on every row (`session_log.active`,
`session_snapshot.active`), so reads never evaluate this; a move computes the
ranges whose status it changes (`changes`) and updates only those.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

#: An open interval of sequences (low, high): low < seq < high.
Interval = tuple[int, int]


@dataclass(frozen=True)
class Timeline:
    #: Abandoned open intervals (low, high), sorted and disjoint.
    abandoned: tuple[Interval, ...] = ()
    #: The newest rewind record this view includes (0: none).
    newest_record: int = 0

    @classmethod
    def from_records(cls, records: Iterable[tuple[int, int]]) -> Timeline:
        """`records` are (record sequence, target sequence) pairs.

        Latest-first, every interval kept so far belongs to a later record, so its
        high end is above the record at hand: the record lies inside one exactly
        when it lies above the lowest kept low end. One pass, whatever the count.
        """
        intervals: list[Interval] = []
        newest = 0
        lowest = None
        for seq, target in sorted(records, reverse=True):
            newest = max(newest, seq)
            if lowest is not None and seq > lowest:
                continue  # abandoned by a later rewind: it counts for nothing
            intervals.append((target, seq))
            lowest = target if lowest is None else min(lowest, target)
        return cls(_merged(intervals), newest)

    def is_active(self, seq: int) -> bool:
        at = bisect.bisect_left(self.abandoned, (seq,)) - 1
        return at < 0 or not self.abandoned[at][0] < seq < self.abandoned[at][1]


@dataclass(frozen=True)
class Changes:
    """What a move does to the log: closed sequence ranges [first, last]."""

    abandoned: tuple[tuple[int, int], ...] = ()
    restored: tuple[tuple[int, int], ...] = ()


def changes(before: Timeline, after: Timeline) -> Changes:
    """The ranges whose status differs between two timelines."""
    old, new = _closed(before.abandoned), _closed(after.abandoned)
    return Changes(abandoned=_minus(new, old), restored=_minus(old, new))


def _closed(intervals: tuple[Interval, ...]) -> list[tuple[int, int]]:
    return [(low + 1, high - 1) for low, high in intervals if high - low > 1]


def _minus(
    ranges: list[tuple[int, int]], taken: list[tuple[int, int]]
) -> tuple[tuple[int, int], ...]:
    """The parts of sorted disjoint closed `ranges` outside sorted disjoint `taken`."""
    kept: list[tuple[int, int]] = []
    at = 0
    for first, last in ranges:
        start = first
        while at < len(taken) and taken[at][1] < start:
            at += 1
        probe = at
        while probe < len(taken) and taken[probe][0] <= last:
            if taken[probe][0] > start:
                kept.append((start, taken[probe][0] - 1))
            start = max(start, taken[probe][1] + 1)
            probe += 1
        if start <= last:
            kept.append((start, last))
    return tuple(kept)


def _merged(intervals: list[Interval]) -> tuple[Interval, ...]:
    merged: list[Interval] = []
    for low, high in sorted(intervals):
        if merged and low < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)
