"""Probe (stop 28): what a prompt that arrives at a busy engine waits, against one that arrives at an idle engine,
in the worker's own loop (common/worker/runtime.py: late launch, messages taken between steps and while the GPU
runs one), without the router and the client.

The one-GPU validation (issue 21) found short prompts that reached a colocated worker while it decoded a few
sequences launched as soon after they reached it as those that found it idle, and their first token came about
1 ms later; the simulator had them wait for the step in flight and the one it had already scheduled, about 3 ms
later. This times, on the engine `serve` builds:
- the launch clock's own figures (`LaunchClock.prep_s`, `step_s`, how often the loop waited before a launch),
  stepping as the worker steps;
- a prompt of PROMPT tokens arriving at a random moment while a decode batch of B runs (B = 0: idle), from its
  arrival to the step that returned its first token: median and p90 over REPS arrivals; and which step it
  joined, counted from the last step launched before it arrived (1: the next launch).
- the profiler's own launch figure for the same batches, stepping back to back as `decode_point` does;
- (added after calls 1, 3 and 8 of stop 28 ran it) how long after it was due the loop took the prompt in: the first
  token is timed from then, so this is the wait the loop's launches add before it.

    PYTHONPATH=... python docs/gpu_runs/stop28_arrival_probe.py MODEL_DIR [REPS [DEVICE]]
"""
from __future__ import annotations

import random
import statistics
import sys
import time

from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.planner.measure.steps import Prompts, drain
from scripts.planner.profile_config import ProfileConfig

PROMPT = 300
BATCHES = (0, 1, 4, 16, 64)
CONTEXT = 300


class Loop:
    """The worker's loop around the engine (Worker._run), with one message: a prompt due at a given moment."""

    def __init__(self, engine, prompts: Prompts):
        self.engine, self.prompts, self.ids = engine, prompts, iter(range(1 << 30))
        self.waits = self.steps = self.launches = 0
        self.due: float | None = None
        self.seq = None
        self.arrived = 0.0
        self.arrived_after = 0  # launches begun before it arrived
        self.late = 0.0  # from when it was due to when the loop took it in (the loop launching a step meanwhile)

    def take(self) -> None:
        """The worker's poll: the prompt joins the engine once it is due."""
        if self.due is not None and (now := time.perf_counter()) >= self.due:
            self.arrived, self.arrived_after, self.late, self.due = now, self.launches, now - self.due, None
            self.seq = self.engine.add_request(f"probe-{next(self.ids)}", self.prompts.make(PROMPT),
                                               SamplingParams(max_tokens=2, ignore_eos=True))

    def first_token(self, due: float) -> tuple[float, int]:
        """Steps the loop until a prompt due at `due` has its first token: (seconds from its arrival, which launch
        it rode, counted from its arrival: 1 is the first launch after it)."""
        engine = self.engine
        self.due, self.seq, rode = due, None, 0
        while True:
            self.take()
            if not engine.has_unfinished():
                continue  # idle: the worker sits in poll until the message comes
            if engine.launch_delay() > 0:
                self.waits += 1
                continue  # the worker polls until the launch is due
            waiting = self.seq is not None and self.seq in engine.scheduler.waiting
            self.launches += 1
            updated = engine.step(idle=self.take)
            self.steps += 1
            if waiting and self.seq not in engine.scheduler.waiting and not rode:
                rode = self.launches - self.arrived_after
            if self.seq is not None and self.seq in updated and self.seq.num_completion_tokens >= 1:
                return time.perf_counter() - self.arrived, rode


def main() -> None:
    model = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    llm = LLM.from_config(ProfileConfig(model=model, device=device, out="/tmp/unused.json").engine_config())
    engine = llm.engine
    prompts, rng = Prompts(engine.config.model_config.vocab_size), random.Random(0)
    loop = Loop(engine, prompts)
    try:
        for batch in BATCHES:
            rids = []
            for i in range(batch):
                rids.append(f"dec-{batch}-{i}")
                engine.add_request(rids[-1], prompts.make(CONTEXT), SamplingParams(max_tokens=100000,
                                                                                  ignore_eos=True))
            for _ in range(20):  # past their prefill, the clock warm
                if engine.has_unfinished():
                    engine.step()
            loop.waits = loop.steps = 0
            preps, times, rode, late = [], [], [], []
            launched = engine.clock.launched
            engine.clock.launched = lambda prep_s: (preps.append(prep_s), launched(prep_s))
            for _ in range(reps):
                seconds, k = loop.first_token(time.perf_counter() + rng.uniform(0.002, 0.006))
                times.append(seconds)
                rode.append(k)
                late.append(loop.late * 1e3)
                if batch == 0:
                    drain(engine)
                    time.sleep(0.002)
            del engine.clock.launched
            ms = sorted(t * 1e3 for t in times)
            step = engine.clock.step_s
            print(f"batch {batch:>3}: first token {statistics.median(ms):6.2f} ms median, {ms[int(0.9 * len(ms))]:6.2f}"
                  f" p90 (min {ms[0]:.2f}); rode launch {statistics.median(rode)} after its arrival "
                  f"(1: {rode.count(1)}, 2: {rode.count(2)}, other: {len(rode) - rode.count(1) - rode.count(2)}); "
                  f"clock prep {1e3 * statistics.median(preps) if preps else float('nan'):.3f} ms, step "
                  f"{1e3 * step if step else float('nan'):.3f} ms; the loop waited before "
                  f"{loop.waits} polls over {loop.steps} steps; taken in {statistics.median(late):.3f} ms after it was "
                  f"due (p90 {sorted(late)[int(0.9 * len(late))]:.3f})", flush=True)
            # the profiler's reading of the same batch: steps back to back, no launch delay
            if batch:
                preps = []
                engine.clock.launched = lambda prep_s: (preps.append(prep_s), launched(prep_s))
                ends = [time.perf_counter()]
                for _ in range(30):
                    engine.step()
                    ends.append(time.perf_counter())
                del engine.clock.launched
                print(f"           back to back (the profiler's way): prep {1e3 * statistics.median(preps):.3f} ms,"
                      f" step interval {1e3 * statistics.median(b - a for a, b in zip(ends, ends[1:])):.3f} ms",
                      flush=True)
            for rid in rids:
                engine.abort(rid)
            drain(engine)
    finally:
        llm.close()


if __name__ == "__main__":
    main()
