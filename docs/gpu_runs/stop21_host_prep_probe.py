"""Probe (stop 21): where the host's time to schedule and launch a decode step goes (the launch clock's `prep_s`).

The H100 profile of stop 20 has `launch_prep_s` 1.70 ms against a decode step of 1.2-1.5 ms on the GPU at small
batches: the host, not the GPU, would then set the pace of decoding. This runs steady decode steps back to back
(overlapped, CUDA graphs, as served) on Qwen3-0.6B with random weights and prints, per batch:
- the step interval and the clock's prep (median);
- the host time of each part of a step (timers wrapped around the engine's and runner's functions, median ms);
- cProfile's top functions by own time over the same steps (its overhead inflates the totals; read the ranks).

    PYTHONPATH=... python docs/gpu_runs/stop21_host_prep_probe.py /tmp/q06 [batches]
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from common.engine import model_runner as runner_mod
from scripts.bench_engine import make_llm, start_decodes

STEPS = int(os.environ.get("STEPS", 300))


def timed(owner, name: str, log: dict[str, list[float]]):
    fn = getattr(owner, name, None)
    if fn is None:  # a part this tree does not have
        return lambda: None

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            log.setdefault(name, []).append(time.perf_counter() - t)
    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, fn)


def upload_parts(device: torch.device) -> None:
    """The parts of one packed upload of a batch-8 step's tensors (median us over 500)."""
    try:
        from common.engine import upload as up
    except ImportError:
        return
    hosts = [torch.arange(120), torch.tensor([[0, 1], [2, 3]]), torch.rand(8), torch.arange(8)]
    stream = torch.cuda.Stream(device)
    parts: dict[str, list[float]] = {"pinned alloc": [], "pack": [], "to device": [], "whole": []}
    for _ in range(500):
        t0 = time.perf_counter()
        buf = torch.empty(1024, dtype=torch.uint8, pin_memory=True)
        t1 = time.perf_counter()
        raw, at = buf.numpy(), 0
        for t in hosts:
            flat = t.reshape(-1).view(torch.uint8)
            raw[at:at + flat.numel()] = flat.numpy()
            at += 256
        t2 = time.perf_counter()
        up._to_device(buf, device, stream)
        t3 = time.perf_counter()
        up.upload(hosts, device, stream)
        t4 = time.perf_counter()
        for k, a, b in zip(parts, (t0, t1, t2, t3), (t1, t2, t3, t4)):
            parts[k].append(b - a)
    print("  upload parts: " + ", ".join(f"{k} {statistics.median(v) * 1e6:.1f} us" for k, v in parts.items()))


def main() -> None:
    path = Path(sys.argv[1])
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,8,64").split(",")]
    llm = make_llm(path, max_num_seqs=256, max_model_len=4096, **({"device": "cpu", "dtype": "float32"} if not torch.cuda.is_available() else {}))
    engine, runner = llm.engine, llm.engine.runner
    print(torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", flush=True)
    if torch.cuda.is_available():
        upload_parts(runner.device)
    for batch in batches:
        rids = start_decodes(llm, batch, 512, 3 * STEPS + 50)
        preps, ends = [], []
        launched = engine.clock.launched
        engine.clock.launched = lambda p: (preps.append(p), launched(p))
        log: dict[str, list[float]] = {}
        undo = [timed(engine.scheduler, "schedule", log), timed(engine.scheduler, "advance", log),
                timed(engine, "_collect", log), timed(runner, "launch", log), timed(runner, "pack", log),
                timed(runner, "_upload", log), timed(runner_mod, "upload", log),
                timed(runner, "execute", log),
                timed(runner, "_sampling_batch", log), timed(runner_mod, "sample", log),
                timed(runner_mod.InFlight, "start", log), timed(runner_mod, "unpack_step", log)]
        if runner.graphs is not None:
            undo.append(timed(runner.graphs, "replay", log))
        for _ in range(STEPS):
            engine.step()
            ends.append(time.perf_counter())
        for u in undo:
            u()
        del engine.clock.launched
        interval = statistics.median(b - a for a, b in zip(ends, ends[1:]))
        print(f"\n== batch {batch}: step interval {interval * 1e3:.3f} ms, clock prep {statistics.median(preps) * 1e3:.3f}"
              f" ms, GPU step {(engine.clock.step_s or 0) * 1e3:.3f} ms", flush=True)
        for name, xs in log.items():
            print(f"  {name:<16} {statistics.median(xs) * 1e3:7.3f} ms  (x{len(xs) / STEPS:.0f} a step)")
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(STEPS):
            engine.step()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(28)
        print("\n".join(line for line in out.getvalue().splitlines()[6:] if line.strip()))
        for rid in rids:
            engine.abort(rid)
        while engine.has_unfinished():
            engine.step()


if __name__ == "__main__":
    main()
