"""How often to log a problem that repeats: a peer can make kproxy hit the same problem
thousands of times a second, and a log that says it each time buries everything else."""

from __future__ import annotations

import time


class LogBudget:
    """Which occurrences of a repeating problem to log: each kind once per interval, at most
    ``kinds_per_interval`` kinds; the rest are counted and reported with the next one logged."""

    def __init__(self, interval: float, kinds_per_interval: int, clock=time.monotonic):
        self.interval = interval
        self.kinds_per_interval = kinds_per_interval
        self.clock = clock
        self._ends = float("-inf")
        self._logged: set = set()
        self._unlogged = 0

    def admit(self, kind) -> int | None:
        """None if this occurrence is not to be logged; else how many were not logged before it."""
        now = self.clock()
        if now >= self._ends:
            self._ends = now + self.interval
            self._logged.clear()
        if kind in self._logged or len(self._logged) >= self.kinds_per_interval:
            self._unlogged += 1
            return None
        self._logged.add(kind)
        unlogged, self._unlogged = self._unlogged, 0
        return unlogged
