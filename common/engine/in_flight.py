"""A launched step's sampled tokens on their way to the CPU, and the CUDA events that time its GPU work."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class InFlight:
    """A launched step's sampled tokens, on their way to the CPU; events around its GPU work."""

    host: torch.Tensor
    started: torch.cuda.Event | None
    event: torch.cuda.Event | None

    @staticmethod
    def mark() -> torch.cuda.Event:
        """A timing event on the current stream, recorded before a step's work is queued."""
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @classmethod
    def start(cls, tokens: torch.Tensor, started: torch.cuda.Event | None = None) -> InFlight:
        if not tokens.is_cuda:  # a copy, as on CUDA: `tokens` may be a buffer the next step overwrites
            return cls(tokens.clone(), None, None)
        host = tokens.to("cpu", non_blocking=True)  # into pinned memory, which a non-blocking copy to the host takes
        event = torch.cuda.Event(enable_timing=started is not None)
        event.record()
        return cls(host, started, event)

    def tokens(self, idle: Callable[[torch.cuda.Event], None] | None = None) -> list[int]:
        """The sampled tokens, once the GPU has them; `idle` is called with the event they wait for, over and over
        until then (a server takes its messages meanwhile, or waits blocked until the event wakes it)."""
        if self.event is not None:
            if idle is not None:
                while not self.event.query():
                    idle(self.event)
            self.event.synchronize()
        return self.host.tolist()

    def gpu_seconds(self) -> float | None:
        """The step's GPU time, from its first queued kernel to its tokens' copy; call after tokens()."""
        if self.started is None or self.event is None:
            return None
        return self.started.elapsed_time(self.event) / 1e3
