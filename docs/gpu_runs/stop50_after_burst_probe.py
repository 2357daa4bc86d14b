"""Stop 50: decode steps after a burst of prompt-like work in another process. Served under MPS with the prefill
worker uncapped, decode steps stayed slow for ~20 ms after a long prompt ended, though the prefill process had no
GPU work left; with the prefill worker capped at 30% of the SMs they did not. Is it the GPU's clock (the long
prompt at full power), seen from two plain processes?

    --role burst: every PERIOD s, BURST_MS of 4096-square bf16 matmuls, synchronised; writes a line a burst:
                  its start and end wall times.
    --role decode: Qwen3-0.6B decode steps of 8 sequences back to back for SECONDS; writes each step's end.
    --role report: decode steps' median time by time since the last burst ended (and during bursts).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def burst(args) -> None:
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    n = 0
    while time.perf_counter() - start < 0.2:
        a @ b
        torch.cuda.synchronize()
        n += 1
    per = (time.perf_counter() - start) / n
    reps = max(1, round(args.burst_ms / 1e3 / per))
    end_all = time.time() + args.seconds
    with open(args.out, "w") as out:  # a line a burst: the caller kills this process when the decode run is over
        while time.time() < end_all:
            t0 = time.time()
            for _ in range(reps):
                a @ b
            torch.cuda.synchronize()
            out.write(f"{t0} {time.time()}\n")
            out.flush()
            time.sleep(max(0.0, args.period - (time.time() - t0)))


def decode(args) -> None:
    from common.config import EngineConfig
    from common.engine.llm import LLM
    from common.sampling_params import SamplingParams
    from scripts.planner.measure.steps import Prompts

    llm = LLM.from_config(EngineConfig(model=args.model, device="cuda", gpu_memory_utilization=0.3))
    engine = llm.engine
    prompts = Prompts(engine.config.model_config.vocab_size)
    for i in range(8):
        engine.add_request(f"d{i}", prompts.make(400), SamplingParams(max_tokens=20000, ignore_eos=True))
    while engine.scheduler.waiting:
        engine.step()
    ends = []
    stop = time.time() + args.seconds
    while time.time() < stop:
        engine.step()
        ends.append(time.time())
    llm.close()
    json.dump({"ends": ends}, open(args.out, "w"))


def report(args) -> None:
    bursts = [tuple(map(float, line.split())) for line in open(args.bursts) if line.strip()]
    ends = json.load(open(args.out))["ends"]
    bins = [0.002, 0.005, 0.01, 0.02, 0.05, 1.0]
    by: dict[str, list[float]] = {}
    for a, b in zip(ends, ends[1:]):
        mid = (a + b) / 2
        during = any(s <= mid < e for s, e in bursts)
        since = [mid - e for s, e in bursts if e <= mid]
        key = "during a burst" if during else "no burst yet" if not since else \
            f"< {next(x for x in bins if min(since) < x) * 1e3:.0f} ms after one"
        by.setdefault(key, []).append(b - a)
    far = statistics.median(by.get("< 1000 ms after one", [float("nan")]))
    for key in sorted(by):
        v = by[key]
        print(f"{key:>22}: {len(v):5d} steps, median {statistics.median(v) * 1e3:.3f} ms "
              f"(x{statistics.median(v) / far:.2f} of 50+ ms after)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=["burst", "decode", "report"], required=True)
    ap.add_argument("--model", default="/tmp/q06")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--period", type=float, default=0.15)
    ap.add_argument("--burst-ms", type=float, default=35.0)
    ap.add_argument("--bursts", default="")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    {"burst": burst, "decode": decode, "report": report}[args.role](args)
