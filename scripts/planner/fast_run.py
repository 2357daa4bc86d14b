"""Identical decode steps simulated in bulk: their times in closed form (scripts/planner/engine.py, decode_pool.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class FastRun:
    """k identical decode steps from `start`: step i lasts first + i * growth (contexts grow one token a step)."""

    start: float
    steps: int
    first: float
    growth: float
    # The last time asked of `steps_begun_by`, the steps then, and the answer: the router's view of an engine, a cut
    # and the worker's polling ask it again at one time
    asked: tuple[float, int, int] = field(default=(math.nan, 0, 0), repr=False, compare=False)

    def elapsed(self, k: int) -> float:
        return k * self.first + self.growth * k * (k - 1) / 2

    def steps_begun_by(self, t: float) -> int:
        """Steps that have begun by time t (the last of them may be in flight)."""
        when, steps, k = self.asked
        if when == t and steps == self.steps:
            return k
        k = self._begun_by(t)
        self.asked = (t, self.steps, k)
        return k

    def _begun_by(self, t: float) -> int:
        dt = t - self.start
        if dt < 0:
            return 0
        if self.growth > 0:
            a, b = self.growth / 2, self.first - self.growth / 2
            k = int((-b + math.sqrt(b * b + 4 * a * dt)) / (2 * a))
        else:
            k = int(dt / self.first) if self.first > 0 else self.steps
        while k > 0 and self.elapsed(k) > dt:
            k -= 1
        if k >= self.steps:
            return self.steps
        k += 1  # step k + 1 began by t (step k ended by then)
        while k < self.steps and self.elapsed(k) <= dt:
            k += 1
        return k

    def in_flight(self, t: float) -> int:
        """The step in flight at time t, counted from 1 (the first from the run's start on)."""
        return max(self.steps_begun_by(t), 1)
