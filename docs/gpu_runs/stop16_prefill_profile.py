"""Where an eager prefill step's time goes: wall per step, GPU busy, and the host's Python hot spots (cProfile)."""
import cProfile, pstats, random, sys, tempfile, time
from pathlib import Path
import torch
from common.sampling_params import SamplingParams
from scripts.bench_engine import make_llm, model_dir
from scripts.bench_gpu import sync_time

root = Path(tempfile.mkdtemp())
llm = make_llm(model_dir("qwen3-0.6b", root))
engine = llm.engine
rng = random.Random(0)
one = SamplingParams(max_tokens=1, ignore_eos=True)
ids = iter(range(1 << 30))

def step(n):
    engine.add_request(f"p{next(ids)}", [rng.randint(1, 30000) for _ in range(n)], one)
    t = sync_time(); engine.step(); dt = sync_time() - t
    while engine.has_unfinished(): engine.step()
    return dt

for n in (64, 512, 2048):
    ts = sorted(step(n) for _ in range(8))
    print(f"prefill {n} tokens: min {ts[0]*1e3:.2f} median {ts[4]*1e3:.2f} max {ts[-1]*1e3:.2f} ms", flush=True)
# host time only: no sync inside, time the launch
for n in (64,):
    engine.add_request(f"p{next(ids)}", [rng.randint(1, 30000) for _ in range(n)], one)
    torch.cuda.synchronize(); t = time.perf_counter()
    engine.step(); host = time.perf_counter() - t; torch.cuda.synchronize(); full = time.perf_counter() - t
    print(f"64 tokens: engine.step() returned after {host*1e3:.2f} ms, GPU done after {full*1e3:.2f} ms")
    while engine.has_unfinished(): engine.step()
pr = cProfile.Profile()
pr.enable()
for _ in range(10): step(64)
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(25)
st.sort_stats("cumulative").print_stats(40)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(3): step(64)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
llm.close()
