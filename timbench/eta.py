"""Counts and an ETA for a long loop of similar items (align table rows, preflight steps): "12/45, ETA 3m07s".

The ETA is the mean time of the items finished so far times the items left: crude, but it needs no cost
model and corrects itself as items finish (the same rule as the grid's progress line, runners/progress.py).
"""

from __future__ import annotations

import time

from .grid.cost import fmt_seconds


class Eta:
    """`total` items to do; call `tick()` as each finishes, and print what it returns."""

    def __init__(self, total: int, clock=time.monotonic):
        self.total, self.done, self.clock = total, 0, clock
        self.t0 = clock()

    def tick(self) -> str:
        """Count one finished item; return "done/total, ETA ..." (ETA "-" once all are done)."""
        self.done += 1
        return self.status()

    def status(self) -> str:
        elapsed = self.clock() - self.t0
        left = self.total - self.done
        if left <= 0:
            return f"{self.done}/{self.total}, took {fmt_seconds(elapsed)}"
        eta = fmt_seconds(elapsed / self.done * left) if self.done else "?"
        return f"{self.done}/{self.total}, ETA {eta}"
