"""Kernel warm-up: before an engine says it is ready, run the kinds of step serving will launch, so that no
Triton variant is compiled (or loaded from Triton's on-disk cache) inside a user's TTFT or TPOT.

What a variant depends on is kept small on purpose: the step payload's sections start 16-byte aligned
(step_inputs.py) and the kernels do not specialize on the ints that change from step to step (block-table and
plan widths, triton_ops.py). What is left is the kind of step, which the requests below run through the real
scheduler once each:

- a fresh prefill alone (varlen prefill, KV store, fused norm/rope, greedy sampling);
- a prefill over cached prefix blocks beside a decode whose context the plan splits (paged prefill, the decode
  kernel with its plan and reduce), with temperature, top-k/top-p and seeded sampling in one batch (torch's
  sampler), then without the top-k/top-p row (the fused Gumbel sampler);
- short decodes beside a new prefill (the decode kernel, one program a sequence);
- decode-only steps (CUDA-graph replays captured at start, or eager ones with --enforce-eager);
- on a GPU, one forward at each size a step with prefills is padded to (step_sizes.padded_tokens), so that cuBLAS
  has chosen every GEMM shape's algorithm before the first request.

The prefix cache is emptied afterwards and the engine's step totals reset: warm-up leaves no trace a user or a
benchmark could see.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from common.engine.compile_watch import CompileWatch
from common.engine.step_sizes import token_buckets
from common.sampling_params import SamplingParams

log = logging.getLogger(__name__)

SPLIT_CONTEXT = 200  # tokens: a lone decode this long is cut into several units (decode_plan: > 1.5 x 64)
SHORT_CONTEXT = 24  # tokens: one unit a decode


@dataclass
class WarmupReport:
    seconds: float
    variants: list[str]  # Triton variants compiled or loaded from disk during warm-up


def _prompt(n: int, salt: int, vocab: int) -> list[int]:
    return [(salt * 7919 + i * 31 + 1) % vocab for i in range(n)]


def warm_up(engine) -> WarmupReport:
    """Runs the warm-up requests on `engine` (an LLMEngine with nothing queued) to completion."""
    start = time.perf_counter()
    cfg = engine.config
    vocab, bs = cfg.model_config.vocab_size, cfg.block_size
    longest = min(cfg.max_model_len - 8, cfg.max_num_batched_tokens)
    split_len = max(min(max(SPLIT_CONTEXT, bs + 8), longest), 2)  # past one full block, to be cached
    short_len = max(min(SHORT_CONTEXT, longest), 2)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = iter(range(1 << 30))

    def add(prompt: list[int], sampling: SamplingParams) -> None:
        engine.add_request(f"warmup-{next(ids)}", prompt, sampling)

    def run(steps: int | None = None) -> None:
        n = 0
        while engine.has_unfinished() and (steps is None or n < steps):
            engine.step()
            n += 1

    with CompileWatch() as watch:
        first = _prompt(split_len, 1, vocab)
        add(first, greedy)  # a fresh prefill alone, then its (split) decodes
        run(steps=3)
        shared = first[:max(bs, (split_len - 1) // bs * bs)] + _prompt(3, 2, vocab)  # full cached blocks + new
        # top-k/top-p rows finish first: the steps after them sample the others in the fused kernel
        sampled = [SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True),
                   SamplingParams(max_tokens=2, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True),
                   SamplingParams(max_tokens=6, temperature=0.8, seed=7, ignore_eos=True)]
        add(shared, sampled[0])
        for i, sp in enumerate(sampled[1:]):
            add(_prompt(short_len + i, 3 + i, vocab), sp)
        run()
        for i in range(4):  # short decodes, then a prefill joins them
            add(_prompt(short_len, 10 + i, vocab), greedy)
        run(steps=3)
        add(_prompt(short_len + 1, 20, vocab), greedy)
        run()
        if cfg.device == "cuda":  # each padded step size's GEMM shapes, met once now (step_sizes.padded_tokens)
            for n in token_buckets(cfg.max_num_batched_tokens):
                engine.runner.forward_fresh(n)
    engine.reset_after_warmup()
    report = WarmupReport(time.perf_counter() - start, watch.variants)
    log.info("kernel warm-up: %d Triton variants ready in %.1f s", len(report.variants), report.seconds)
    return report
