"""Stop 56 (issue 21, then 20): prompt steps past 2,048 tokens in CUDA graphs. One engine as `serve` builds it with
the default prompt graphs (to 2,048 tokens: longer steps run eagerly, their host launching kernel by kernel), then
one with graphs to the whole step budget; for each, the start-up time and GPU memory, then prompt steps of several
sizes (one prompt, and three), each timed as the profiler times it (synchronised before and after, the least of
REPS) and split at the `step()` call that launches it (its host time). Then where an eager step's host time goes
(torch's profiler, one 4,096-token step: the ops with the most host time of their own).

    python docs/gpu_runs/stop56_prompt_graphs_probe.py /tmp/q06 [--reps 5] [--device cuda]
"""
from __future__ import annotations

import argparse
import gc
import random
import time

import torch

from common.config import EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams

SIZES = (2048, 2432, 3072, 4096, 6144, 8000)


def timed_steps(engine, sizes: list[int], reps: int, rng: random.Random, sync) -> tuple[float, float]:
    """(least launch host time, least whole step) over `reps` steps of prompts of `sizes`, after one untimed."""
    one, vocab = SamplingParams(max_tokens=1, ignore_eos=True), min(32000, engine.config.model_config.vocab_size)
    best = (float("inf"), float("inf"))
    for rep in range(reps + 1):
        for n in sizes:
            engine.add_request(f"g{rng.random()}", [rng.randint(1, vocab - 1) for _ in range(n)], one)
        sync()
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        if rep:
            best = (min(best[0], t1 - t0), min(best[1], t2 - t0))
    return 1e3 * best[0], 1e3 * best[1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile-ops", type=int, default=12, help="ops shown from torch's profiler (0: none)")
    args = p.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rng = random.Random(0)
    for name, graphs in (("graphs to 2048", 2048), ("graphs to the budget", 1 << 20)):
        if cuda:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        llm = LLM.from_config(EngineConfig(model=args.model, device=args.device,
                                           prefill_graph_max_tokens=graphs))
        ready = time.perf_counter() - start
        engine = llm.engine
        budget = min(engine.config.max_num_batched_tokens, engine.config.max_model_len)
        runner = engine.runner.prefill_graphs
        top = runner.sizes[-1] if runner is not None else 0
        memory = (torch.cuda.memory_reserved() - base) / 2**30 if cuda else 0.0
        print(f"{name}: ready in {ready:.1f} s, prompt graphs to {top} tokens "
              f"({len(runner.graphs) if runner else 0} graphs), {memory:.2f} GiB reserved")
        for n in (s for s in SIZES if s <= budget):
            one = timed_steps(engine, [n], args.reps, rng, sync)
            third = [n // 3, n // 3, n - 2 * (n // 3)]
            three = timed_steps(engine, third, args.reps, rng, sync)
            print(f"  {n:5d} tokens: one prompt launch {one[0]:6.2f} step {one[1]:6.2f} ms; "
                  f"three prompts launch {three[0]:6.2f} step {three[1]:6.2f} ms")
        if graphs == 2048 and args.profile_ops:
            n = min(4096, budget)
            vocab = min(32000, engine.config.model_config.vocab_size)
            engine.add_request("traced", [rng.randint(1, vocab - 1) for _ in range(n)],
                               SamplingParams(max_tokens=1, ignore_eos=True))
            sync()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                engine.step()
            sync()
            while engine.has_unfinished():
                engine.step()
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_ops,
                                            max_name_column_width=50))
        llm.close()
        del llm, engine, runner
        gc.collect()


if __name__ == "__main__":
    main()
