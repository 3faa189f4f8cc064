"""A budget of log lines, so that a flood of bad calls cannot flood the log."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

#: Refusals logged per server: at most LOG_LINES lines per LOG_PERIOD_S seconds.
LOG_LINES = 10
LOG_PERIOD_S = 10.0


class LogBudget:
    """At most `lines` log lines per `period_s`: a flood of refusals cannot flood the log.

    `take()` is None while the budget is spent; otherwise the number of lines held
    back since the last one that passed, for that line to mention.
    """

    def __init__(
        self,
        lines: int = LOG_LINES,
        period_s: float = LOG_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lines = lines
        self.period_s = period_s
        self.clock = clock
        self._window_start = -math.inf
        self._used = 0
        self._held = 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        with self._lock:
            now = self.clock()
            if now - self._window_start >= self.period_s:
                self._window_start, self._used = now, 0
            if self._used >= self.lines:
                self._held += 1
                return None
            self._used += 1
            held, self._held = self._held, 0
            return held
