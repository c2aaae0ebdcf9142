"""The progress line of a grid run: done / running / failed / pending counts and an ETA, on stderr.

The ETA is the mean wall time of the cells finished in this invocation times
the cells still to go, divided by the parallel workers: crude, but it needs no
cost model and self-corrects as cells finish.
"""

from __future__ import annotations

import sys
import time

from timbench.grid.cost import fmt_seconds


class Progress:
    """Counts for one invocation; `line()` renders them, `emit()` prints when they changed (or every minute).

    `stream` None means the current sys.stderr, looked up at each print.
    """

    def __init__(
        self, label: str, total: int, done: int, failed: int, workers: int, stream=None, every_s: float = 60.0
    ):
        self.label, self.total, self.workers, self.stream, self.every_s = label, total, max(1, workers), stream, every_s
        self.done, self.failed, self.running = done, failed, 0
        self.walls: list[float] = []
        self.running_steps = None
        """Optional callable -> (steps done, steps in all) of the running cells (runner-set; see `steps_of`)."""
        self._last: tuple | None = None
        self._last_t = 0.0

    @property
    def pending(self) -> int:
        return self.total - self.done - self.failed - self.running

    def finished(self, status: dict) -> None:
        """Account for a cell that just ended with cell.json `status`."""
        self.running -= 1
        if status["status"] == "done":
            self.done += 1
        else:
            self.failed += 1
        self.walls.append(float(status.get("wall_s") or 0.0))

    def eta(self) -> str:
        if not self.walls:
            return "?"
        left = self.pending + self.running
        return fmt_seconds(sum(self.walls) / len(self.walls) * left / self.workers)

    def line(self) -> str:
        steps = ""
        if self.running and self.running_steps is not None:
            done, total = self.running_steps()
            steps = f" (steps {done}/{total})"
        return (
            f"[grid {self.label}] {self.done}/{self.total} done, {self.running} running{steps}, "
            f"{self.failed} failed, {self.pending} pending, ETA {self.eta()}"
        )

    def emit(self, force: bool = False) -> None:
        key = (self.done, self.running, self.failed)
        now = time.monotonic()
        if force or key != self._last or now - self._last_t >= self.every_s:
            print(self.line(), file=self.stream or sys.stderr, flush=True)
            self._last, self._last_t = key, now


def steps_of(out: str, cells: list[dict]) -> tuple[int, int]:
    """(steps logged, steps configured) summed over `cells`: a metrics.jsonl line per finished step."""
    from timbench.grid.layout import run_dir

    done = total = 0
    for cell in cells:
        total += int(cell["config"].get("steps") or 0)
        try:
            done += (run_dir(out, cell["id"]) / "metrics.jsonl").read_bytes().count(b"\n")
        except OSError:  # not started yet
            pass
    return done, total
