"""Probe (stop 26): is a prompt step slower when the GPU runs them back to back than alone, as the profile times it?

A saturated prefill worker (2xH200, Qwen3-8B, the prefill-heavy mix) ran its steps 9-15% slower than the profile's
fit, one-prompt graphed steps among them. The profile times each point as the least of a few steps alone. This
times the same steps both ways on the engine `serve` builds, with the GPU's SM clock, power and temperature
sampled beside them (nvidia-smi every 100 ms):
- alone: each step after a 0.5 s pause, 5 times (least and median);
- back to back: the same step over and over for SECONDS, each synchronised (ms a step in each second, and the
  clock and power in that second).

    PYTHONPATH=... python docs/gpu_runs/stop26_sustained_probe.py MODEL_DIR [SECONDS [DEVICE [DIVISOR]]]

(DEVICE cpu and a DIVISOR of the prompt sizes: a dry run on a tiny model.)
"""
from __future__ import annotations

import statistics
import subprocess
import sys
import time

from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.planner.measure.steps import Prompts, device_now, drain
from scripts.planner.profile_config import ProfileConfig

KINDS = {"one prompt of 1536 (graphed)": [1536], "six prompts of 1333 (eager)": [1333] * 6,
         "one prompt of 8192 (eager)": [8192]}


def step_seconds(engine, prompts: Prompts, sizes: list[int], ids) -> float:
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    for n in sizes:
        engine.add_request(f"probe-{next(ids)}", prompts.make(n), one)
    device = engine.runner.device
    start = device_now(device)
    engine.step()
    seconds = device_now(device) - start
    if engine.last_step.num_prefill_tokens != sum(sizes):
        raise RuntimeError(f"a step ran {engine.last_step.num_prefill_tokens} tokens, not {sum(sizes)}")
    drain(engine)
    return seconds


def smi_samples(path: str) -> list[tuple[float, float, float, float]]:
    """(time, SM MHz, watts, degrees C) from nvidia-smi's log."""
    rows = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), float(parts[3])))
        except (ValueError, IndexError):
            continue
    return rows


def main() -> None:
    model, seconds = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    device, divisor = (sys.argv[3], int(sys.argv[4])) if len(sys.argv) > 4 else ("cuda", 1)
    kinds = {name: [n // divisor for n in sizes] for name, sizes in KINDS.items()}
    llm = LLM.from_config(ProfileConfig(model=model, device=device, out="/tmp/unused.json").engine_config())
    engine, prompts, ids = llm.engine, Prompts(llm.engine.config.model_config.vocab_size), iter(range(1 << 30))
    log = "/tmp/stop26-smi.csv"
    smi = subprocess.Popen(
        ["bash", "-c", "while true; do echo $(date +%s.%N),$(nvidia-smi -i 0 --query-gpu=clocks.sm,power.draw,"
         "temperature.gpu --format=csv,noheader,nounits); sleep 0.1; done"], stdout=open(log, "w"))
    try:
        for name, sizes in kinds.items():
            step_seconds(engine, prompts, sizes, ids)  # untimed
            alone = []
            for _ in range(5):
                time.sleep(0.5)
                alone.append(step_seconds(engine, prompts, sizes, ids))
            print(f"{name}: alone least {min(alone) * 1e3:.1f} ms, median {statistics.median(alone) * 1e3:.1f} ms",
                  flush=True)
            start, times = time.time(), []
            while time.time() - start < seconds:
                t0 = time.time()
                times.append((t0, step_seconds(engine, prompts, sizes, ids)))
            samples = smi_samples(log)
            for second in range(int(seconds)):
                lo, hi = start + second, start + second + 1
                ms = [s * 1e3 for t, s in times if lo <= t < hi]
                smi_in = [r for r in samples if lo <= r[0] < hi]
                if ms and (second < 3 or second % 3 == 0 or second == int(seconds) - 1):
                    clock = statistics.median(r[1] for r in smi_in) if smi_in else float("nan")
                    watts = statistics.median(r[2] for r in smi_in) if smi_in else float("nan")
                    temp = max(r[3] for r in smi_in) if smi_in else float("nan")
                    print(f"  back to back, second {second:>2}: {statistics.median(ms):7.1f} ms a step "
                          f"({len(ms)} steps), SM {clock:.0f} MHz, {watts:.0f} W, {temp:.0f} C", flush=True)
            time.sleep(3)
    finally:
        smi.terminate()
        llm.close()


if __name__ == "__main__":
    main()
