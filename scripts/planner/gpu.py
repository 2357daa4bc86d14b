"""One GPU that one or more simulated engines run on (`pdcluster serve --gpus-per-worker 0.5` puts two on one).

A GPU runs one engine's step at a time: an engine whose step is ready while another's runs waits its turn, first
come first served, and schedules its batch when it gets the GPU (so it takes whatever arrived while it waited).
Each engine on it holds its memory share of the GPU's KV blocks. Real processes time-slice a GPU less neatly:
kernels of two processes can overlap a little, and switching costs a little; neither is modelled.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(eq=False)
class Gpu:
    index: int
    holder: object = None  # the engine whose step (or fast run) is in flight here
    waiting: deque = field(default_factory=deque)  # engines with a step ready, oldest first

    def take(self, engine: object) -> bool:
        """Whether `engine` may start a step now; if not, it waits its turn (once, however often it asks)."""
        if self.holder is None or self.holder is engine:
            self.holder = engine
            return True
        if engine not in self.waiting:
            self.waiting.append(engine)
        return False

    def release(self, engine: object) -> None:
        if self.holder is engine:
            self.holder = None

    def next_waiting(self) -> object | None:
        """The engine whose turn it is, now that the GPU is free (it holds the GPU); None when none waits."""
        if self.holder is not None or not self.waiting:
            return None
        self.holder = self.waiting.popleft()
        return self.holder


def pack(fractions: list[float]) -> list[int]:
    """The GPU of each engine of `fractions` GPUs each (min 1), in launch order, filling one GPU before the next
    (as Ray places fractional GPU requests on one node)."""
    gpus, used = [], 0.0
    index = -1
    for share in fractions:
        share = min(1.0, share)
        if index < 0 or used + share > 1.0 + 1e-9:
            index, used = index + 1, 0.0
        used += share
        gpus.append(index)
    return gpus
