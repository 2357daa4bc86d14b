"""One GPU that one or more simulated engines run on (`pdcluster serve --gpus-per-worker 0.5` puts two on one).

Two processes on one GPU (no MPS) time-slice it: the GPU switches between their contexts, so while both have a
step in flight each progresses at about half the pace it has alone, and a step alone runs at full pace. That is
processor sharing: each step in flight is its profile time of work, done at 1/n of the GPU while n engines have
a step in flight; a step's end moves whenever another engine's step starts or ends (scripts/planner/sim.py
re-times them). Each engine on it holds its memory share of the GPU's KV blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class Gpu:
    index: int
    shared: bool = False  # more than one engine on it
    work: dict = field(default_factory=dict)  # engine -> seconds its step in flight still needs of a whole GPU
    host_paced: set = field(default_factory=set)  # engines whose step in flight goes at its host's pace
    since: float = 0.0  # when `work` was last brought up to date

    def share(self, engine: object) -> float:
        """The pace of `engine`'s step now, as a share of its pace alone."""
        return 1.0 if engine in self.host_paced else 1.0 / len(self.work)

    def advance(self, now: float) -> None:
        for engine in self.work:
            self.work[engine] -= (now - self.since) * self.share(engine)
        self.since = now

    def add(self, engine: object, seconds: float, now: float, host_paced: bool = False) -> None:
        """`engine` starts a step of `seconds` (its time alone on the GPU); `host_paced`: launch-bound."""
        self.advance(now)
        self.work[engine] = seconds
        (self.host_paced.add if host_paced else self.host_paced.discard)(engine)

    def remove(self, engine: object, now: float) -> None:
        self.advance(now)
        self.work.pop(engine, None)

    def ends(self, now: float) -> dict[object, float]:
        """When each step in flight ends if none starts or ends before."""
        return {engine: now + max(0.0, work) / self.share(engine) for engine, work in self.work.items()}


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
