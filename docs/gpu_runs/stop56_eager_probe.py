"""Stop 56 (issue 21): an eager prompt step (past the prompt graphs), on an engine of its own as the profiler builds
it. Each step is timed as the profiler times it (synchronised before and after) and split at the `step()` call that
launches it (its host time: schedule, pack, launch), for sizes the profiler measures, repeated, and for a fresh
size each step, as a server meets them, in one and in three prompts; with a thread that wakes every millisecond
(a server's other threads) and without; the caching allocator's device allocations and retries counted for each.

    python docs/gpu_runs/stop56_eager_probe.py /tmp/q06 [--steps 20]
"""
from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import torch

from common.config import EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams


def tick(stop: threading.Event) -> None:
    while not stop.wait(0.001):
        pass


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    cuda = args.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    llm = LLM.from_config(EngineConfig(model=args.model, device=args.device))
    engine = llm.engine
    graph_max = engine.runner.prefill_graphs.sizes[-1] if engine.runner.prefill_graphs is not None else 0
    budget = min(engine.config.max_num_batched_tokens, engine.config.max_model_len)
    vocab = min(32000, engine.config.model_config.vocab_size)
    print(f"prompt graphs to {graph_max} tokens; step budget {budget}")
    rng, ids = random.Random(0), iter(range(1 << 30))
    one = SamplingParams(max_tokens=1, ignore_eos=True)

    def step(sizes: list[int]) -> tuple[float, float]:
        for n in sizes:
            engine.add_request(f"e{next(ids)}", [rng.randint(1, vocab - 1) for _ in range(n)], one)
        sync()
        t0 = time.perf_counter()
        engine.step()  # launches the step (nothing in flight before it to collect)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        return 1e3 * (t1 - t0), 1e3 * (t2 - t0)

    def split(total: int, parts: int) -> list[int]:
        cuts = sorted(rng.sample(range(1, total), parts - 1))
        return [b - a for a, b in zip([0] + cuts, cuts + [total])]

    def run(name: str, sizes: list[list[int]]) -> None:
        stats0 = (torch.cuda.memory_stats() if cuda else {})
        timed = [step(s) for s in sizes]
        stats1 = (torch.cuda.memory_stats() if cuda else {})
        delta = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in ("num_device_alloc", "num_device_free",
                                                                  "num_alloc_retries")}
        launch, total = [t for t, _ in timed], [t for _, t in timed]
        tokens = statistics.median(sum(s) for s in sizes)
        print(f"{name:44s} tokens p50 {tokens:6.0f}: launch p50 {statistics.median(launch):6.2f} min "
              f"{min(launch):6.2f} ms, step p50 {statistics.median(total):6.2f} min {min(total):6.2f} ms; {delta}")

    lo = graph_max + 1
    for ticker in (False, True):
        stop = threading.Event()
        if ticker:
            threading.Thread(target=tick, args=(stop,), daemon=True).start()
        tag = " (1 ms ticker)" if ticker else ""
        for n in (s for s in (2432, 4096, 8000) if lo <= s <= budget):
            step([n])  # untimed
            run(f"fixed {n}{tag}", [[n]] * 5)
        run(f"fresh size, one prompt{tag}", [[rng.randint(lo, budget)] for _ in range(args.steps)])
        run(f"fresh size, three prompts{tag}", [split(rng.randint(lo, budget), 3) for _ in range(args.steps)])
        run(f"fixed {min(4096, budget)} again{tag}", [[min(4096, budget)]] * 5)
        stop.set()
    llm.close()


if __name__ == "__main__":
    main()
