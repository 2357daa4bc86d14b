"""Startup and the first requests on one GPU: does the first minute run as fast as the tenth?

    python -m scripts.bench_startup [--config qwen3-0.6b] [--requests 120] [--eager]

Runs the same child twice with one fresh Triton cache folder: first cold (an empty cache: every variant is
compiled), then warm (every variant is on disk). Each child prints the engine's start-up time and its warm-up's
share, then sends requests one at a time (a prompt, a few decode steps, mixed sampling) and prints the TTFT of
requests 1-20 against 101-120 (the same lengths and sampling), and how many Triton variants were compiled or loaded
after ready (should be 0).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(args: argparse.Namespace) -> dict:
    from common.engine.compile_watch import CompileWatch
    from common.sampling_params import SamplingParams
    from scripts.bench_engine import make_llm, model_dir
    from scripts.bench_gpu import sync_time

    path = Path(args.root) / args.config
    if not (path / "config.json").exists():  # the warm run reuses the cold run's folder
        path = model_dir(args.config, Path(args.root))
    t0 = time.perf_counter()
    llm = make_llm(path, enforce_eager=args.eager, max_model_len=4096, gpu_memory_utilization=0.5)
    startup = time.perf_counter() - t0
    engine, rng = llm.engine, random.Random(0)
    vocab = engine.config.model_config.vocab_size
    kinds = [dict(temperature=0.0), dict(temperature=0.7), dict(temperature=0.8, top_p=0.9),
             dict(temperature=0.8, seed=5)]
    ttfts = []
    with CompileWatch() as watch:
        for i in range(args.requests):
            shape = random.Random(i % 100)  # requests i and i + 100 have the same length and sampling
            ids = [rng.randrange(vocab) for _ in range(shape.randint(20, 2000))]
            engine.add_request(f"r{i}", ids, SamplingParams(max_tokens=8, ignore_eos=True, **shape.choice(kinds)))
            start, first = sync_time(), None
            while engine.has_unfinished():
                for seq in engine.step():
                    if first is None and seq.request_id == f"r{i}":
                        first = sync_time() - start
            ttfts.append(first)
    llm.close()
    return dict(startup=startup, warmup=engine.warmup.seconds if engine.warmup else 0.0,
                warmup_variants=len(engine.warmup.variants) if engine.warmup else 0,
                after_ready=watch.variants, ttft=ttfts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-0.6b")
    p.add_argument("--requests", type=int, default=120)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    with tempfile.TemporaryDirectory() as root:
        env = dict(os.environ, TRITON_CACHE_DIR=str(Path(root) / "triton"))
        cmd = [sys.executable, "-m", "scripts.bench_startup", "--child", "--root", root, "--config", args.config,
               "--requests", str(args.requests)] + (["--eager"] if args.eager else [])
        print(f"== startup and first requests: {args.config} bf16, {'eager' if args.eager else 'CUDA graphs'}, "
              f"{args.requests} requests one at a time (20-2000 prompt tokens, 8 output tokens)")
        print(f"{'Triton cache':<14}{'startup s':>10}{'warm-up s':>10}{'variants':>9}{'after ready':>12}"
              f"{'TTFT 1-20 ms':>14}{'TTFT 101-120 ms':>17}{'ratio':>7}   (TTFT: medians)")
        for label in ("cold", "warm"):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"the {label} run failed:\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            first = statistics.median(r["ttft"][:20]) * 1e3
            late = statistics.median(r["ttft"][100:120] or r["ttft"][-20:]) * 1e3
            print(f"{label:<14}{r['startup']:>10.1f}{r['warmup']:>10.2f}{r['warmup_variants']:>9}"
                  f"{len(r['after_ready']):>12}{first:>14.2f}{late:>17.2f}{first / late:>7.2f}")
            for v in r["after_ready"]:
                print(f"   compiled after ready: {v}")
            ratios = [a / b for a, b in zip(r["ttft"][:20], r["ttft"][100:120])]
            print("   TTFT of request i / request i+100, i = 1..20: " + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
