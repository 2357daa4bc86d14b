"""Engine steps, timed warm on the engine `serve` would run (CUDA graphs, warm-up, overlapped scheduling as
configured): prefill steps against prompt tokens and a cached prefix, decode steps against batch and context,
steps that mix a prompt with a decode batch, and the host's own work in each decode step.

Every figure is a whole step as the engine runs it, host work included; the fit (scripts/planner/fit.py) splits
off `host_launch_s`, the simulator adds it back to every step.
"""
from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from common.config import ConfigError
from common.engine.llm_engine import LLMEngine
from common.sampling_params import SamplingParams
from scripts.planner.points import DecodePoint, MixedPoint, PrefillPoint, SustainedPoint

WARM_DECODE_STEPS = 3  # decode steps run, untimed, before a decode point's timed ones


@dataclass(frozen=True)
class Grid:
    """What to measure; `quick` is a sparser one."""

    prefill_shares: tuple[float, ...]  # prompt tokens, as shares of the step budget
    prefill_contexts: tuple[int, ...]  # cached prefixes before them (0: none)
    prefill_reps: int  # timed steps per point, after one untimed
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int  # timed steps per point
    handoff_tokens: tuple[int, ...]
    handoff_reps: int  # timed handoffs per size, after one untimed
    mixed_batches: tuple[int, ...] = (1, 16, 64)  # decode batches a prompt joins (mixed steps)
    mixed_share: float = 1 / 32  # the prompt's tokens, as a share of the step budget
    sustained_s: float = 4.0  # seconds of prompt steps back to back (SustainedPoint)

    @classmethod
    def make(cls, quick: bool) -> Grid:
        if quick:
            return cls((1 / 64, 1 / 8, 1 / 2, 1.0), (0, 2048), 3, (1, 2, 16, 64, 256), (256, 2048), 12,
                       (512, 4096, 16384), 3, (1, 32), sustained_s=2.0)
        return cls((1 / 128, 1 / 32, 1 / 8, 1 / 4, 1 / 2, 1.0), (0, 1024, 4096), 5, (1, 2, 8, 32, 64, 128, 256),
                   (128, 1024, 4096), 20, (256, 1024, 4096, 16384), 5, (1, 16, 64))


def device_now(device: torch.device) -> float:
    """perf_counter once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class Prompts:
    """Random token ids, never twice the same prompt (so the prefix cache hits only where a test means it to)."""

    def __init__(self, vocab: int, seed: int = 0):
        self.rng = random.Random(seed)
        self.top = max(2, min(vocab, 32000)) - 1

    def make(self, n: int) -> list[int]:
        return [self.rng.randint(1, self.top) for _ in range(n)]


def drain(engine: LLMEngine) -> None:
    while engine.has_unfinished():
        engine.step()


def timed_step(engine: LLMEngine) -> float:
    """One engine step, synchronised on both sides: its seconds, host work included."""
    start = device_now(engine.runner.device)
    engine.step()
    return device_now(engine.runner.device) - start


# ---- prefill ----------------------------------------------------------------------------------------

def prefill_plan(grid: Grid, budget: int, max_len: int, block_size: int) -> list[tuple[int, int]]:
    """(prompt tokens, cached prefix) pairs that fit the step budget and the model length; prefixes whole blocks."""
    sizes = sorted({max(16, min(budget, round(budget * s))) for s in grid.prefill_shares})
    contexts = {c // block_size * block_size for c in grid.prefill_contexts if c + min(sizes) < max_len}
    if len(contexts) < 2 and max_len - budget > block_size:  # a short model: the longest prefix that fits
        contexts.add((max_len - budget - 1) // block_size * block_size)
    return [(n, c) for c in sorted(contexts) for n in sizes if n + c < max_len]  # and room for its one token


def measure_prefill(engine: LLMEngine, grid: Grid, prompts: Prompts, progress: Callable[[str], None]
                    ) -> list[PrefillPoint]:
    """One prompt a step, alone: the step that computes it, synchronised; the least of a few. A cached prefix is
    made by running it first as a prompt of its own; the next prompt starting with it finds its blocks in the
    prefix cache."""
    cfg = engine.config
    plan = prefill_plan(grid, cfg.max_num_batched_tokens, cfg.max_model_len, cfg.block_size)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    prefixes: dict[int, list[int]] = {}
    points, ids = [], iter(range(1 << 30))
    for tokens, context in plan:
        if context and context not in prefixes:
            prefixes[context] = prompts.make(context)
            engine.add_request(f"profile-prefix-{context}", prefixes[context], one)
            drain(engine)
        times = []
        for rep in range(grid.prefill_reps + 1):
            seq = engine.add_request(f"profile-p{next(ids)}", prefixes.get(context, []) + prompts.make(tokens), one)
            seconds = timed_step(engine)
            if seq.num_cached_tokens != context or engine.last_step.num_prefill_tokens != tokens:
                raise RuntimeError(f"profile: a {tokens}-token prompt after a {context}-token prefix ran "
                                   f"{engine.last_step.num_prefill_tokens} tokens with {seq.num_cached_tokens} "
                                   "cached: the prefix cache or the step budget is not as expected")
            drain(engine)
            if rep:  # the first is untimed
                times.append(seconds)
        points.append(PrefillPoint(tokens, context, min(times)))  # interference (other processes) only adds
        progress(f"prefill {tokens:>6} tokens after {context:>6} cached: {points[-1].seconds * 1e3:9.3f} ms")
    return points


SUSTAINED_PROMPTS = 6  # the step budget split among this many prompts, as a saturated prefill worker's steps are
PAUSE_S = 0.5  # before each step timed alone


def measure_sustained(engine: LLMEngine, grid: Grid, prompts: Prompts, progress: Callable[[str], None]
                      ) -> SustainedPoint:
    """A step of the whole budget in SUSTAINED_PROMPTS prompts, alone (the least of three, each after a pause, as
    the prefill points are timed) and back to back for `grid.sustained_s` (the median of the second half's steps):
    a GPU under its power limit runs a saturated worker's steps slower than the profile's points."""
    budget = engine.config.max_num_batched_tokens
    sizes = [budget // SUSTAINED_PROMPTS] * SUSTAINED_PROMPTS
    one, ids = SamplingParams(max_tokens=1, ignore_eos=True), iter(range(1 << 30))

    def step() -> float:
        for n in sizes:
            engine.add_request(f"profile-s{next(ids)}", prompts.make(n), one)
        seconds = timed_step(engine)
        if engine.last_step.num_prefill_tokens != sum(sizes):
            raise RuntimeError(f"profile: a step of {SUSTAINED_PROMPTS} prompts, {sum(sizes)} tokens, ran "
                               f"{engine.last_step.num_prefill_tokens}: the step budget is not as expected")
        drain(engine)
        return seconds

    step()  # untimed
    alone = []
    for _ in range(3):
        time.sleep(PAUSE_S)
        alone.append(step())
    began, times = time.perf_counter(), []
    while time.perf_counter() - began < grid.sustained_s:
        times.append(step())
    point = SustainedPoint(sum(sizes), len(sizes), min(alone), statistics.median(times[len(times) // 2:]))
    progress(f"prefill {point.tokens} tokens in {point.prompts} prompts: {point.alone_s * 1e3:.3f} ms alone, "
             f"{point.back_to_back_s * 1e3:.3f} ms back to back ({len(times)} steps)")
    return point


# ---- decode and the host's work ---------------------------------------------------------------------

@dataclass
class HostClock:
    """Seconds the host spends in the scheduler (schedule, advance, resolve) and packing a step's inputs: the
    engine's per-step CPU work besides launching the device's."""

    seconds: float = 0.0
    patched: list[tuple[object, str]] = field(default_factory=list)

    @contextmanager
    def timing(self, engine: LLMEngine):
        for owner, name in ((engine.scheduler, "schedule"), (engine.scheduler, "advance"),
                            (engine.scheduler, "resolve"), (engine.runner, "pack")):
            setattr(owner, name, self._timed(getattr(owner, name)))
            self.patched.append((owner, name))
        try:
            yield self
        finally:
            for owner, name in self.patched:
                delattr(owner, name)  # the class's method shows through again
            self.patched.clear()

    def _timed(self, fn: Callable) -> Callable:
        def timed(*args, **kw):
            start = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


@dataclass(frozen=True)
class DecodeResult:
    point: DecodePoint
    host_s: float  # the host's work per step (HostClock)
    prep_s: float = 0.0  # the host's time to schedule and launch a step, as the engine's launch clock takes it


def decode_growth(grid: Grid, batch: int, context: int, budget: int) -> int:
    """Tokens the first sequence of a point may grow by: it decodes while the others' prompts are still being
    prefilled (chunked under the step budget), then through the warm and the timed steps."""
    return -(-batch * context // budget) + batch + WARM_DECODE_STEPS + grid.decode_steps + 4


def decode_plan(grid: Grid, max_num_seqs: int, budget: int, max_len: int, num_blocks: int, block_size: int
                ) -> tuple[list[tuple[int, int]], list[str]]:
    """(batch, context) pairs whose sequences fit max_num_seqs, the model length and the KV pool; and why the
    others were left out."""
    batches = sorted({b for b in grid.decode_batches if b <= max_num_seqs}
                     | {min(max_num_seqs, max(grid.decode_batches))})
    short = decode_growth(grid, 1, 0, budget) + 16
    contexts = {c for c in grid.decode_contexts if c + short <= max_len}
    if len(contexts) < 2 and max_len - short >= block_size:  # a short model: the longest context that fits
        contexts.add((max_len - short) // block_size * block_size)
    plan, skipped = [], []
    for c in sorted(contexts):
        for b in batches:
            growth = decode_growth(grid, b, c, budget)
            grown = max(spread_contexts(b, c)) + growth
            need = sum(-(-(n + growth) // block_size) for n in spread_contexts(b, c))
            if grown > max_len:
                skipped.append(f"batch {b} x context {c} (would grow past max_model_len {max_len})")
            elif need > 0.95 * num_blocks:
                skipped.append(f"batch {b} x context {c} (needs {need} KV blocks of {num_blocks})")
            else:
                plan.append((b, c))
    return plan, skipped


def spread_contexts(batch: int, context: int) -> list[int]:
    """`batch` prompt lengths of mean `context`, evenly from context/3 to 5 context/3: a serving batch mixes lengths,
    and the decode kernel's plan costs more over mixed lengths than over equal ones of the same total
    (docs/gpu_runs/stop19_decode_spread.py)."""
    if batch == 1:
        return [context]
    return [max(1, round(context * (1 + 2 * (2 * i - (batch - 1)) / (3 * (batch - 1))))) for i in range(batch)]


def start_decodes(engine: LLMEngine, prompts: Prompts, batch: int, context: int, max_tokens: int) -> list[str]:
    """`batch` sequences of `spread_contexts` prompt tokens, all past their prefill and a few decode steps."""
    rids = [f"profile-d{batch}-{context}-{i}" for i in range(batch)]
    for rid, length in zip(rids, spread_contexts(batch, context)):
        engine.add_request(rid, prompts.make(length), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed() > 1 for s in sched.running):
        engine.step()
    for _ in range(WARM_DECODE_STEPS):
        engine.step()
    return rids


def decode_point(engine: LLMEngine, prompts: Prompts, grid: Grid, batch: int, context: int) -> DecodeResult:
    """Steady decode steps back to back, as serving runs them (overlapped where configured): their median time,
    the batch's mean total context over them, and the host's work per step."""
    device = engine.runner.device
    steps = grid.decode_steps
    rids = start_decodes(engine, prompts, batch, context,
                         decode_growth(grid, batch, context, engine.config.max_num_batched_tokens))
    seqs = [engine.requests[r] for r in rids]
    before = sum(s.num_computed_tokens for s in seqs)
    ends = [device_now(device)]
    preps: list[float] = []
    launched = engine.clock.launched
    engine.clock.launched = lambda prep_s: (preps.append(prep_s), launched(prep_s))
    try:
        with HostClock().timing(engine) as host:
            for _ in range(steps):
                engine.step()
                ends.append(time.perf_counter())
                if engine.last_step.num_prefill_tokens or engine.last_step.num_decode_tokens != batch:
                    raise RuntimeError(f"profile: a decode step of batch {batch} ran {engine.last_step}")
    finally:
        del engine.clock.launched  # the class's method shows through again
    # Each step waits for the tokens of the one before (or its own, without overlap): in the steady state the
    # interval between step ends is the step. The median leaves out what other processes took.
    seconds = statistics.median(b - a for a, b in zip(ends, ends[1:]))
    after = sum(s.num_computed_tokens for s in seqs)
    for rid in rids:
        engine.abort(rid)
    drain(engine)
    return DecodeResult(DecodePoint(batch, round((before + after) / 2), seconds), host.seconds / steps,
                        statistics.median(preps) if preps else 0.0)


def measure_decode(engine: LLMEngine, grid: Grid, prompts: Prompts, progress: Callable[[str], None]
                   ) -> tuple[list[DecodeResult], list[str]]:
    cfg = engine.config
    plan, skipped = decode_plan(grid, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
                                engine.block_manager.num_blocks, cfg.block_size)
    if not plan:
        raise ConfigError(f"profile: no decode batch fits this engine ({engine.block_manager.num_blocks} KV blocks, "
                          f"max_model_len {cfg.max_model_len}): give it more KV memory")
    results = []
    for batch, context in plan:
        results.append(decode_point(engine, prompts, grid, batch, context))
        r = results[-1]
        progress(f"decode batch {batch:>4} x context {context:>6}: {r.point.seconds * 1e3:9.3f} ms/step "
                 f"(host {r.host_s * 1e3:.3f} ms, launch {r.prep_s * 1e3:.3f} ms)")
    return results, skipped


def launch_prep_seconds(results: list[DecodeResult]) -> float:
    """What late launch leads a decode step by is 1.25x this (common/engine/launch_clock.py): the host's time to
    schedule and launch one, the median over the decode points."""
    return statistics.median(r.prep_s for r in results)


def host_launch_seconds(results: list[DecodeResult]) -> float:
    """The host's work per step at the smallest batch measured: the part of every step that does not grow with
    the batch (what does grow is in the decode fit's per-sequence cost, as measured)."""
    smallest = min(r.point.batch for r in results)
    return statistics.median(r.host_s for r in results if r.point.batch == smallest)


# ---- a prompt beside a decode batch -----------------------------------------------------------------

def mixed_plan(grid: Grid, max_num_seqs: int, budget: int, max_len: int, num_blocks: int, block_size: int
               ) -> list[tuple[int, int, int]]:
    """(batch, context, prompt tokens) for the mixed steps: the grid's batches that fit max_num_seqs (one seat
    left for the prompt) and the KV pool, at the smallest decode context, the prompt within the step budget."""
    context = min(grid.decode_contexts)
    growth = decode_growth(grid, max(grid.mixed_batches), context, budget) + 3 * (grid.prefill_reps + 1)
    tokens = max(16, round(budget * grid.mixed_share))
    plan = []
    for b in sorted(set(grid.mixed_batches)):
        grown = max(spread_contexts(b, context)) + growth
        need = (sum(-(-(n + growth) // block_size) for n in spread_contexts(b, context))
                + -(-tokens // block_size) * (grid.prefill_reps + 1))
        if b < max_num_seqs and b + tokens <= budget and grown + tokens < max_len and need <= 0.95 * num_blocks:
            plan.append((b, context, tokens))
    return plan


def mixed_point(engine: LLMEngine, prompts: Prompts, grid: Grid, batch: int, context: int, tokens: int
                ) -> MixedPoint:
    """A prompt joins `batch` running decodes: the one step that computes it beside them (eager: it has prompt
    tokens), synchronised as the prefill points are; the least of a few. Between reps the prompt's token comes
    back and the decodes go on alone."""
    growth = WARM_DECODE_STEPS + 3 * (grid.prefill_reps + 1) + 8
    rids = start_decodes(engine, prompts, batch, context,
                         decode_growth(grid, batch, context, engine.config.max_num_batched_tokens) + growth)
    seqs = [engine.requests[r] for r in rids]
    times, contexts = [], []
    for rep in range(grid.prefill_reps + 1):
        engine.add_request(f"profile-m{batch}-{rep}", prompts.make(tokens), SamplingParams(max_tokens=1,
                                                                                             ignore_eos=True))
        total = sum(s.num_computed_tokens for s in seqs)
        seconds = timed_step(engine)
        step = engine.last_step
        if step.num_prefill_tokens != tokens or step.num_decode_tokens != batch:
            raise RuntimeError(f"profile: a {tokens}-token prompt beside {batch} decodes ran {step}")
        for _ in range(2):  # the prompt's token comes back; the decodes go on alone
            engine.step()
        if rep:
            times.append(seconds)
            contexts.append(total)
    for rid in rids:
        engine.abort(rid)
    drain(engine)
    return MixedPoint(batch, round(statistics.mean(contexts)), tokens, min(times))


def measure_mixed(engine: LLMEngine, grid: Grid, prompts: Prompts, progress: Callable[[str], None]
                  ) -> list[MixedPoint]:
    cfg = engine.config
    points = []
    for batch, context, tokens in mixed_plan(grid, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len,
                                             engine.block_manager.num_blocks, cfg.block_size):
        points.append(mixed_point(engine, prompts, grid, batch, context, tokens))
        progress(f"mixed: {tokens} prompt tokens beside {batch:>4} decodes of context {context:>6}: "
                 f"{points[-1].seconds * 1e3:9.3f} ms")
    return points
