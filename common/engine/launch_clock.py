"""When to launch the next decode step, with overlapped scheduling.

Launching step N+1 as soon as step N is queued keeps the GPU busy, but a request that arrives while step N
runs (a KV handoff landing, a new prompt) then waits for N+1 to run too: its first interval between
tokens is two steps. Launching N+1 only shortly before N ends keeps the GPU as busy and lets that request
join N+1. The clock learns how long a decode-only step runs on the GPU (CUDA events) and how long the host
takes to build and launch one; the lead is a quarter more than the latter plus a tenth of the step, so a
slower launch or step than the last ones costs a little GPU idle at worst. Where the host's launch work
nears the step (a small model), the lead covers the whole step and the clock never waits.

A clock in an MPS client (`contended`: `serve --mps` shares the GPU between processes whose kernels run side by
side) errs early instead: a step faster than the estimate sets it at once, a slower one moves the average, and the
server launches as soon as the step in flight has ended, however late the clock said (`LLMEngine.launch_delay`).
There CUDA events time the other process's contention: decode steps beside a long prompt took about three times
their time alone, and an average that fell slowly from them kept the GPU idle for a dozen steps after the prompt
ended. Time-sliced, events time only the step's own slices and the average holds; the early clock there served
long-short at 32 req/s with a higher TPOT (docs/benchmarks.md, "Stop 51").
"""
from __future__ import annotations

from dataclasses import dataclass

EMA = 0.2  # weight of the newest sample
LEAD_PREP_FACTOR = 1.25  # the lead covers this many times the host's launch work ...
LEAD_STEP_SHARE = 0.1  # ... and this share of the step, against their variation


@dataclass
class LaunchClock:
    contended: bool = False  # an MPS client: err early (above)
    step_s: float | None = None  # GPU time of a decode-only step, EMA
    prep_s: float | None = None  # host time to schedule and launch a step, EMA
    deadline: float | None = None  # host time to launch the next step by; None: now

    def launched(self, prep_s: float) -> None:
        self.prep_s = prep_s if self.prep_s is None else (1 - EMA) * self.prep_s + EMA * prep_s

    def collected(self, gpu_s: float | None, decode_only: bool) -> None:
        """A step's tokens are back; `gpu_s`: its GPU time if the device measured it."""
        if decode_only and gpu_s is not None:
            at_once = self.step_s is None or (self.contended and gpu_s < self.step_s)
            self.step_s = gpu_s if at_once else (1 - EMA) * self.step_s + EMA * gpu_s

    def in_flight(self, started: float | None, decode_only: bool) -> None:
        """A step is on the GPU since about `started` (host time) and none is queued behind it: the next
        launch is due one step later, less the lead. Unknown steps (prefills, no estimate yet) launch at once."""
        if started is None or not decode_only or self.step_s is None or self.prep_s is None:
            self.deadline = None
            return
        lead = LEAD_PREP_FACTOR * self.prep_s + LEAD_STEP_SHARE * self.step_s
        self.deadline = started + self.step_s - lead

    def delay(self, now: float) -> float:
        """Seconds to wait before launching the next step (0: launch now)."""
        return 0.0 if self.deadline is None else max(0.0, self.deadline - now)
