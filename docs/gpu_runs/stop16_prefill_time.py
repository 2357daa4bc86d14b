"""Eager prefill step time, one prompt a step (run from a tree's root)."""
import random, sys, tempfile
from pathlib import Path
from common.sampling_params import SamplingParams
from scripts.bench_engine import make_llm, model_dir
from scripts.bench_gpu import sync_time

llm = make_llm(model_dir(sys.argv[2] if len(sys.argv) > 2 else "qwen3-0.6b", Path(tempfile.mkdtemp())))
engine, rng, ids = llm.engine, random.Random(0), iter(range(1 << 30))
one = SamplingParams(max_tokens=1, ignore_eos=True)
def step(n):
    engine.add_request(f"p{next(ids)}", [rng.randint(1, 30000) for _ in range(n)], one)
    t = sync_time(); engine.step(); dt = sync_time() - t
    while engine.has_unfinished(): engine.step()
    return dt
row = []
for n in (64, 512, 2048, 8192):
    ts = sorted(step(n) for _ in range(9))
    row.append(f"{n}: {ts[0]*1e3:.2f}/{ts[4]*1e3:.2f}")
print(sys.argv[1], "prefill ms min/median:", "  ".join(row), flush=True)
llm.close()
