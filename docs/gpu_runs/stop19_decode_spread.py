"""Probe (stop 19, issue 21): does a decode step over contexts of mixed lengths cost more than one over equal
contexts of the same total (what `pdcluster profile` measures)? Steady decode steps back to back on one engine
built as `serve` builds it: median step interval and median GPU seconds (CUDA events), equal vs spread contexts.

    PYTHONPATH=... python docs/gpu_runs/stop19_decode_spread.py /tmp/q06
"""
from __future__ import annotations

import random
import statistics
import sys
import time

from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.planner.profile_config import ProfileConfig

STEPS = 40


def point(engine, lengths: list[int], vocab: int, tag: str) -> tuple[float, float, int]:
    rng = random.Random(0)
    rids = [f"{tag}-{i}" for i in range(len(lengths))]
    for rid, n in zip(rids, lengths):
        engine.add_request(rid, [rng.randrange(vocab) for _ in range(n)],
                           SamplingParams(max_tokens=STEPS + 64, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed() > 1 for s in sched.running):
        engine.step()
    for _ in range(8):
        engine.step()
    context = sum(engine.requests[r].num_computed_tokens for r in rids)
    ends, gpu = [time.perf_counter()], []
    for _ in range(STEPS):
        engine.step()
        ends.append(time.perf_counter())
        gpu.append(engine.last_step.gpu_seconds)
    for rid in rids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return (statistics.median(b - a for a, b in zip(ends, ends[1:])), statistics.median(gpu), context)


def main() -> None:
    cfg = ProfileConfig(model=sys.argv[1], device="cuda", out="/tmp/unused.json")
    llm = LLM.from_config(cfg.engine_config())
    engine = llm.engine
    vocab = engine.config.model_config.vocab_size
    rng = random.Random(1)
    for batch in (8, 16, 32, 48, 64, 96):
        for mean in (1024, 1400):
            spread = [rng.randint(mean // 3, 5 * mean // 3) for _ in range(batch)]
            scale = mean * batch / sum(spread)
            spread = [max(16, round(n * scale)) for n in spread]
            rows = []
            for tag, lengths in (("equal", [mean] * batch), ("spread", spread), ("equal2", [mean] * batch)):
                step, gpu, context = point(engine, lengths, vocab, f"{tag}{batch}-{mean}")
                rows.append(f"{tag} {1e3 * step:.3f}/{1e3 * gpu:.3f} ms (ctx {context})")
            print(f"batch {batch:>3} mean ctx {mean}: " + "  ".join(rows), flush=True)
    llm.close()


if __name__ == "__main__":
    main()
