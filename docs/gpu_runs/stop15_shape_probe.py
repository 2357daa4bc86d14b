"""Is a prefill slower the first time its token count is seen? One engine (Qwen3-0.6B, warm-up done), prompts of
20 distinct lengths run one at a time: round 1, the same lengths again (round 2), then 20 new lengths (round 3)."""
import random, statistics, tempfile
from pathlib import Path
from common.sampling_params import SamplingParams
from scripts.bench_engine import make_llm, model_dir
from scripts.bench_gpu import sync_time

llm = make_llm(model_dir("qwen3-0.6b", Path(tempfile.mkdtemp())), max_model_len=4096, gpu_memory_utilization=0.5)
engine, rng = llm.engine, random.Random(0)
lengths = rng.sample(range(20, 2000), 40)

def one(n, tag):
    engine.add_request(tag, [rng.randrange(1, 100000) for _ in range(n)], SamplingParams(max_tokens=1, ignore_eos=True))
    t0 = sync_time()
    while engine.has_unfinished():
        engine.step()
    return (sync_time() - t0) * 1e3

rounds = {"first lengths, 1st time": lengths[:20], "same lengths, 2nd time": lengths[:20], "new lengths, 1st time": lengths[20:]}
for name, ls in rounds.items():
    ms = [one(n, f"{name}-{i}") for i, n in enumerate(ls)]
    print(f"{name:<26} median {statistics.median(ms):6.2f} ms  mean {statistics.mean(ms):6.2f} ms")
