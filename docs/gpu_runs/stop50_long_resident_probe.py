"""Stop 50: a decode step with one long context among short ones. Served under MPS (long-short mix), a short
request's tokens came 1.6-1.7x slower while a long request sat in the decode batch, with no prompt step in flight;
served colocated or time-sliced, 1.2-1.3x. This times decode steps of a few batches, run as `profile` runs them
(back to back, median of the step-to-step interval), in one process: run it once uncapped and once as an MPS client
at the decode worker's share to see whether the cap alone makes the long context cost more.

    python docs/gpu_runs/stop50_long_resident_probe.py --model DIR [--device cuda] [--steps 40] [--short 400 --long 6144]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from common.config import EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.planner.measure.steps import Prompts, device_now


def batches(short: int, long: int) -> list[tuple[str, list[int]]]:
    """(name, prompt lengths): by default the long-short mix's shorts (128-512) and longs (4096-8192)."""
    return [("8 short", [short] * 8), ("8 short + 1 long", [short] * 8 + [long]), ("1 long", [long]),
            ("24 short", [short] * 24), ("24 short + 1 long", [short] * 24 + [long]),
            ("8 short + 1 third-long", [short] * 8 + [long // 3])]

IDLE_CLIENT = ("import time, torch; x = torch.ones(2**28, device='cuda'); torch.cuda.synchronize(); "
               "print('idle client up', flush=True); time.sleep(3600)")


def decode_steps(llm: LLM, prompts: Prompts, lengths: list[int], steps: int) -> float:
    engine = llm.engine
    rids = [f"probe-{len(lengths)}-{i}-{time.monotonic_ns()}" for i in range(len(lengths))]
    for rid, n in zip(rids, lengths):
        engine.add_request(rid, prompts.make(n), SamplingParams(max_tokens=steps + 16, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed() > 1 for s in sched.running):
        engine.step()
    for _ in range(3):
        engine.step()
    ends = [device_now(engine.runner.device)]
    for _ in range(steps):
        engine.step()
        ends.append(time.perf_counter())
        if engine.last_step.num_prefill_tokens or engine.last_step.num_decode_tokens != len(lengths):
            raise RuntimeError(f"not a decode step of {len(lengths)}: {engine.last_step}")
    for rid in rids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--short", type=int, default=400)
    ap.add_argument("--long", type=int, default=6144)
    ap.add_argument("--idle-client", action="store_true",
                    help="a second CUDA process (an MPS client when under MPS) holding memory, idle, throughout")
    args = ap.parse_args()
    idle = None
    if args.idle_client:
        idle = subprocess.Popen([sys.executable, "-c", IDLE_CLIENT], env={**__import__("os").environ,
                                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, stdout=subprocess.PIPE, text=True)
        print(idle.stdout.readline().strip(), flush=True)
    llm = LLM.from_config(EngineConfig(model=args.model, device=args.device, gpu_memory_utilization=0.4))
    prompts = Prompts(llm.engine.config.model_config.vocab_size)
    out = {}
    try:
        for r in range(args.rounds):
            for name, lengths in batches(args.short, args.long):
                ms = decode_steps(llm, prompts, lengths, args.steps) * 1e3
                out.setdefault(name, []).append(round(ms, 3))
                print(f"round {r}: {name:>20}: {ms:.3f} ms/step", flush=True)
    finally:
        llm.close()
        if idle is not None:
            idle.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
