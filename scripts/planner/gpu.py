"""One GPU that one or more simulated engines run on (`pdcluster serve --gpus-per-worker 0.5` puts two on one).

Two processes on one GPU (no MPS) time-slice it: processor sharing. While n engines have a step in flight there,
each step's GPU-bound work goes at 1/n of its pace alone. An eager step (prompt tokens) first has its launch-bound
floor (`SimEngine.host_seconds`: the host launching kernels one by one, the GPU mostly idle), which goes at the
host's pace whatever the other engine does, though the step counts as in flight (its kernels take time slices from
the other's); then its compute, shared. A step's end moves whenever another engine's step starts or ends
(scripts/planner/sim.py re-times them). Each engine on it holds its memory share of the GPU's KV blocks.

Under MPS (`serve --mps`, `Layout.mps`) their kernels run side by side, each process within its share of the SMs:
a step's GPU-bound work takes `alone` times its cost (the share's cap) and (1 + c) times as long for each other step
in flight there, both of its role's `Profile.mps` (c = `beside`: 0, no slowdown; 1, as time-sliced; or c by the
longest prompt of the pair and the rows of its decode step, `MpsCost.contention`). A KV copy there does not wait for
the other engine's step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Contention = Callable[[int, int], float]  # a pair of steps' longest prompt and decode rows -> c


@dataclass(eq=False)
class Gpu:
    index: int
    shared: bool = False  # more than one engine on it
    work: dict = field(default_factory=dict)  # engine -> seconds its step in flight still needs of a whole GPU
    host: dict = field(default_factory=dict)  # engine -> seconds of its step's launch still to go, at its own pace
    since: float = 0.0  # when `work` and `host` were last brought up to date
    beside: dict = field(default_factory=dict)  # engine -> its c (or Contention): 1 time-sliced, less under MPS
    longest: dict = field(default_factory=dict)  # engine -> the longest prompt of its step in flight (0: decodes)
    rows: dict = field(default_factory=dict)  # engine -> the decode rows of its step in flight

    def pace(self, engine: object) -> float:
        """The pace of `engine`'s GPU-bound work now, as a share of its pace alone."""
        beside = self.beside.get(engine, 1.0)
        if not callable(beside):
            return 1.0 / (1.0 + beside * (len(self.work) - 1))
        longest, rows = self.longest.get(engine, 0), self.rows.get(engine, 0)
        return 1.0 / (1.0 + sum(beside(max(longest, self.longest[other]), max(rows, self.rows[other]))
                                for other in self.work if other is not engine))

    def advance(self, now: float) -> None:
        dt = now - self.since
        for engine in self.work:
            launch = self.host.get(engine, 0.0)
            if launch >= dt:
                self.host[engine] = launch - dt
            else:
                self.host[engine] = 0.0
                self.work[engine] -= (dt - launch) * self.pace(engine)
        self.since = now

    def add(self, engine: object, seconds: float, now: float, host_seconds: float = 0.0,
            beside: float | Contention = 1.0, longest: int = 0, rows: int = 0) -> None:
        """`engine` starts a step of `seconds` alone: first `host_seconds` of launch-bound work at its own pace,
        then the rest at its pace beside the other steps in flight (`beside`: its c, or its c by the longest prompt
        and decode rows of a pair; `longest`, `rows`: this step's)."""
        self.advance(now)
        self.host[engine] = min(host_seconds, seconds)
        self.work[engine] = seconds - self.host[engine]
        self.beside[engine] = beside
        self.longest[engine] = longest
        self.rows[engine] = rows

    def remove(self, engine: object, now: float) -> None:
        self.advance(now)
        self.work.pop(engine, None)
        self.host.pop(engine, None)
        self.beside.pop(engine, None)
        self.longest.pop(engine, None)
        self.rows.pop(engine, None)

    def ends(self, now: float) -> dict[object, float]:
        """When each step in flight ends if none starts or ends before."""
        return {engine: now + self.host[engine] + max(0.0, work) / self.pace(engine)
                for engine, work in self.work.items()}


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
