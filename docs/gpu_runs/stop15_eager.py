"""Eager throughput only (bench_engine's workload), for a tree on sys.path; --no-warmup turns warm-up off."""
import sys, tempfile
from pathlib import Path
from scripts.bench_engine import model_dir, workload, make_llm, run_engine
root = Path(tempfile.mkdtemp())
path = model_dir("qwen3-0.6b", root)
work = workload(256)
kw = dict(enforce_eager=True)
if "--no-warmup" in sys.argv:
    kw["warmup"] = False
for graphs in ([False, True] if "--both" in sys.argv else [False]):
    kw["enforce_eager"] = not graphs
    llm = make_llm(path, **kw)
    dt = run_engine(llm, work)
    print(f"{'graphs' if graphs else 'eager':<8} {dt:.2f} s", flush=True)
    llm.close()
