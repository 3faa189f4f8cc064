"""Which parts of the log are abandoned: the arithmetic of rewinds.

A rewind (or checkout) record at sequence R with target N abandons the open
interval (N, R): those events stay in the log but are part of no state. Records
resolve latest-first: a record that falls inside an interval of a later
record is itself abandoned and counts for nothing, which is how a later rewind
subsumes an earlier one and how a checkout onto an abandoned branch undoes the
rewinds that abandoned it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Timeline:
    #: Abandoned open intervals (low, high), sorted and disjoint.
    abandoned: tuple[tuple[int, int], ...] = ()
    #: The newest rewind record this view includes (0: none).
    newest_record: int = 0

    @classmethod
    def from_records(cls, records: Iterable[tuple[int, int]]) -> Timeline:
        """`records` are (record sequence, target sequence) pairs."""
        intervals: list[tuple[int, int]] = []
        newest = 0
        for seq, target in sorted(records, reverse=True):
            newest = max(newest, seq)
            if any(low < seq < high for low, high in intervals):
                continue  # abandoned by a later rewind: it counts for nothing
            intervals.append((target, seq))
        return cls(_merged(intervals), newest)

    def is_active(self, seq: int) -> bool:
        return not any(low < seq < high for low, high in self.abandoned)


def _merged(intervals: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(intervals):
        if merged and low < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)
