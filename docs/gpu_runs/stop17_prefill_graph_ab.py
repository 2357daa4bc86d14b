"""Prompt CUDA graphs against eager prompt forwards, in one process: a lone prompt's step (prefill worker, TTFT floor)
and a step that adds one prompt beside 32 running decodes (colocated / local prefill), median and min of 9 each.
Modes alternate graphs, eager, graphs. Usage: python stop17_prefill_graph_ab.py [qwen3-0.6b|qwen3-8b]"""
import random, sys, tempfile, time
from pathlib import Path
from common.sampling_params import SamplingParams
from scripts.bench_engine import make_llm, model_dir
from scripts.bench_gpu import sync_time

config = sys.argv[1] if len(sys.argv) > 1 else "qwen3-0.6b"
path = model_dir(config, Path(tempfile.mkdtemp()))
rng, ids = random.Random(0), iter(range(1 << 30))
one = SamplingParams(max_tokens=1, ignore_eos=True)
LENS = (16, 128, 512, 1024, 2048, 4096)


def timed_step(engine, n, sampling=one):
    engine.add_request(f"p{next(ids)}", [rng.randint(1, 30000) for _ in range(n)], sampling)
    t = sync_time(); engine.step(); dt = sync_time() - t
    return dt


def lone(engine, n):
    dt = timed_step(engine, n)
    while engine.has_unfinished():
        engine.step()
    return dt


def beside_decodes(engine, n):
    """(the step that adds an n-token prompt to 32 running decodes, the decode-only step before it)"""
    long = SamplingParams(max_tokens=10_000, ignore_eos=True)
    rids = [f"d{next(ids)}" for _ in range(32)]
    for rid in rids:
        engine.add_request(rid, [rng.randint(1, 30000) for _ in range(64)], long)
    for _ in range(4):
        engine.step()
    decode = []
    for _ in range(5):
        t = sync_time(); engine.step(); decode.append(sync_time() - t)
    dt = timed_step(engine, n)
    for rid in rids:
        engine.abort(rid)
    while engine.has_unfinished():
        engine.step()
    return dt, sorted(decode)[2]


for mode, max_tokens in (("graphs", 2048), ("eager", 0), ("graphs", 2048)):
    t0 = time.perf_counter()
    llm = make_llm(path, gpu_memory_utilization=0.45, prefill_graph_max_tokens=max_tokens)
    ready = time.perf_counter() - t0
    engine = llm.engine
    row = []
    for n in LENS:
        ts = sorted(lone(engine, n) for _ in range(9))
        row.append(f"{n}: {ts[4]*1e3:.2f}/{ts[0]*1e3:.2f}")
    print(f"{config} {mode:6s} ready {ready:.1f}s | lone prompt step ms median/min: {'  '.join(row)}", flush=True)
    row = []
    for n in (16, 128, 512):
        pairs = sorted(beside_decodes(engine, n) for _ in range(5))
        row.append(f"{n}: {pairs[2][0]*1e3:.2f} (decode-only {pairs[2][1]*1e3:.2f})")
    print(f"{config} {mode:6s} prompt beside 32 decodes, step ms median: {'  '.join(row)}", flush=True)
    llm.close()
