"""How long starting took, phase by phase: what an engine, a worker and `pdcluster serve` log once they are ready,
so that a slow start says where its time went (loading the model, capturing CUDA graphs, the kernel warm-up, Ray)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Startup:
    """Seconds a phase, in the order the phases ran; a phase timed twice adds up."""

    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - start)

    def add(self, name: str, seconds: float) -> None:
        self.phases[name] = self.phases.get(name, 0.0) + max(0.0, seconds)

    def extend(self, other: Startup) -> None:
        for name, seconds in other.phases.items():
            self.add(name, seconds)

    @property
    def seconds(self) -> float:
        return sum(self.phases.values())

    def summary(self) -> str:
        """`12.3 s (model 1.2 s, KV pool 0.7 s, ...)`: the whole, then each phase."""
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases.items())
        return f"{self.seconds:.1f} s" + (f" ({parts})" if parts else "")
