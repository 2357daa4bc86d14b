"""Probe (stop 19, issue 21): where the planner's step costs miss under load. Replays the requests of stop 18's
colocated validation points (`stop19_step_trace_input.json`: send time, prompt and output length) on one engine
built as `serve` builds it, in a loop like the worker's (late launch included), and records every batch: its
decodes and their contexts, its prompt chunks and theirs, the step that launched it (host seconds) and its GPU
seconds (CUDA events). Writes $OUT/step_trace.json for the comparison with the profile on the CPU
(`stop19_step_trace_compare.py`).

    PYTHONPATH=... python docs/gpu_runs/stop19_step_trace.py /tmp/q06
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.planner.profile_config import ProfileConfig

HERE = Path(__file__).resolve().parent


def replay(engine, requests: list[list], vocab: int) -> dict:
    rng = random.Random(0)
    batches: list[dict] = []
    opened: dict[int, dict] = {}  # id(in flight batch) -> its record, until collected
    launch = engine.runner.launch

    def traced_launch(batch):
        t0 = time.perf_counter()
        in_flight = launch(batch)
        d = batch.num_decodes
        rec = dict(t=t0, launch_s=time.perf_counter() - t0, decodes=d,
                   decode_context=sum(s.num_computed_tokens for s in batch.seqs[:d]),
                   prompt=[[n, s.num_computed_tokens] for s, n in zip(batch.seqs[d:], batch.num_new_tokens[d:])])
        batches.append(rec)
        opened[id(in_flight)] = rec
        return in_flight

    collect = engine._collect

    def traced_collect(batch, in_flight, olds):
        rec = opened.pop(id(in_flight), None)
        out = collect(batch, in_flight, olds)
        if rec is not None:
            rec["gpu_s"] = in_flight.gpu_seconds()
            rec["collected"] = time.perf_counter()
        return out

    engine.runner.launch, engine._collect = traced_launch, traced_collect
    first: dict[str, float] = {}
    sent: dict[str, float] = {}
    pending = list(enumerate(requests))
    t0 = time.perf_counter()
    while pending or engine.has_unfinished():
        now = time.perf_counter() - t0
        while pending and pending[0][1][0] <= now:
            i, (at, plen, olen) = pending.pop(0)
            rid = str(i)
            engine.add_request(rid, [rng.randrange(vocab) for _ in range(plen)],
                               SamplingParams(max_tokens=olen, ignore_eos=True, temperature=0.0))
            sent[rid] = time.perf_counter()
        for seq in engine.step():
            first.setdefault(seq.request_id, time.perf_counter())
        delay = engine.launch_delay()
        if not engine.has_unfinished() and pending:
            delay = max(0.0, pending[0][1][0] - (time.perf_counter() - t0))
        if delay > 0:
            time.sleep(min(delay, 0.005))
    engine.runner.launch, engine._collect = launch, collect
    recs = batches
    for r in recs:
        r["t"] -= t0
        r["collected"] = r.get("collected", t0) - t0
    ttft = sorted(first[k] - sent[k] for k in sent)
    return dict(batches=recs, ttft_p50=ttft[len(ttft) // 2], ttft_p90=ttft[int(0.9 * len(ttft))],
                wall=time.perf_counter() - t0, busy=engine.totals.seconds, gpu=engine.totals.gpu_seconds,
                steps=engine.totals.steps)


def main() -> None:
    model = sys.argv[1]
    points = json.loads(Path(os.environ.get("TRACE_INPUT", HERE / "stop19_step_trace_input.json")).read_text())
    cfg = ProfileConfig(model=model, device=os.environ.get("DEVICE", "cuda"), out="/tmp/unused.json")
    llm = LLM.from_config(cfg.engine_config())
    engine = llm.engine
    vocab = engine.config.model_config.vocab_size
    print(f"engine: step budget {engine.config.max_num_batched_tokens} tokens, {engine.block_manager.num_blocks} "
          f"blocks", flush=True)
    result = {}
    for name, requests in points.items():
        engine.reset_after_warmup()
        out = replay(engine, requests, vocab)
        result[name] = out
        print(f"{name}: {len(out['batches'])} batches, wall {out['wall']:.2f} s, busy {out['busy']:.3f} s, "
              f"gpu {out['gpu']:.3f} s, TTFT p50 {1e3 * out['ttft_p50']:.1f} p90 {1e3 * out['ttft_p90']:.1f} ms",
              flush=True)
    Path(os.environ.get("OUT", "/tmp"), "step_trace.json").write_text(json.dumps(result))
    llm.close()


if __name__ == "__main__":
    main()
