"""Engine benchmarks on one GPU, with random weights of real shapes (speed depends on shapes, not values).

    python -m scripts.bench_engine throughput [--num-seqs 256] [--hf-seqs 32]   # nano-vllm workload, Qwen3-0.6B
    python -m scripts.bench_engine decode [--config qwen3-0.6b] [--context 1024]  # step time vs HBM roofline
    python -m scripts.bench_engine prefill [--config qwen3-8b]                  # tok/s and MFU at 1k/4k/16k
    python -m scripts.bench_engine all

Each figure is printed with what it measures; nothing is asserted. The model directory holds only a
config and a tokenizer (`prepare_tokenizer`); the engine fills the weights with `--load-format dummy`.
"""
from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from common.config import EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from scripts.bench_gpu import cuda_kernels, device_summary, hbm_bandwidth, log, peak_tflops, require_gpus, sync_time
from scripts.model_prep import prepare_tokenizer


WARM = ("warm: each engine compiles (or loads) every kernel variant before it is ready (common/engine/warmup.py), so "
        "no timed step compiles; the cold start itself: python -m scripts.bench_startup")


def model_dir(config: str, root: Path) -> Path:
    return prepare_tokenizer(config, root / config)


def make_llm(path: Path, **kw) -> LLM:
    args = dict(device="cuda", dtype="bfloat16", load_format="dummy", gpu_memory_utilization=0.85)
    args.update(kw)
    return LLM.from_config(EngineConfig(model=str(path), **args))


# ---- offline throughput -------------------------------------------------------------------------
def workload(n: int, seed: int = 0, lo: int = 100, hi: int = 1024, vocab: int = 10001) -> list[tuple[list[int], int]]:
    """nano-vllm's bench: random prompts and output lengths, both uniform in [lo, hi]."""
    rng = random.Random(seed)
    top = min(10000, vocab - 1)
    return [([rng.randint(0, top) for _ in range(rng.randint(lo, hi))], rng.randint(lo, hi)) for _ in range(n)]


def run_engine(llm: LLM, work: list[tuple[list[int], int]]) -> float:
    params = [SamplingParams(max_tokens=m, temperature=0.6, ignore_eos=True) for _, m in work]
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    t0 = sync_time()
    outs = llm.generate([p for p, _ in work], params, use_tqdm=False)
    dt = sync_time() - t0
    assert all(len(o.token_ids) == m for o, (_, m) in zip(outs, work))
    return dt


@torch.inference_mode()
def run_hf(path: Path, work: list[tuple[list[int], int]], batch: int) -> float:
    """HF transformers `generate`, left-padded batches, each run to its longest output."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    pad = 0
    t0 = sync_time()
    for i in range(0, len(work), batch):
        chunk = work[i:i + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk], device="cuda")
        mask = (torch.arange(width, device="cuda")[None] >= torch.tensor([width - len(p) for p, _ in chunk],
                                                                        device="cuda")[:, None]).long()
        new = max(m for _, m in chunk)
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                       do_sample=True, temperature=0.6, pad_token_id=pad)
    dt = sync_time() - t0
    del model
    torch.cuda.empty_cache()
    return dt


def bench_throughput(root: Path, num_seqs: int, hf_seqs: int, tp: int = 1) -> None:
    path = model_dir("qwen3-0.6b", root)
    work = workload(num_seqs)
    out_tokens = sum(m for _, m in work)
    in_tokens = sum(len(p) for p, _ in work)
    log(f"== offline throughput: {num_seqs} seqs, input/output uniform in 100..1024, ignore_eos, Qwen3-0.6B bf16, "
        f"tensor parallel {tp}")
    log(f"   {in_tokens} prompt + {out_tokens} output tokens")
    log(f"   {WARM}")
    log(f"{'mode':<28}{'seqs':>6}{'seconds':>10}{'output tok/s':>14}{'total tok/s':>13}")
    small = work[:hf_seqs]
    small_out = sum(m for _, m in small)
    small_total = small_out + sum(len(p) for p, _ in small)
    modes = (("pdcluster, CUDA graphs", {}), ("pdcluster, eager", {"enforce_eager": True}))
    for name, kw in modes[:1] if tp > 1 else modes:
        llm = make_llm(path, tensor_parallel_size=tp, **kw)
        try:
            dt = run_engine(llm, work)
            log(f"{name:<28}{num_seqs:>6}{dt:>10.2f}{out_tokens / dt:>14.0f}{(in_tokens + out_tokens) / dt:>13.0f}")
            if not kw and hf_seqs:
                dt = run_engine(llm, small)
                log(f"{name:<28}{hf_seqs:>6}{dt:>10.2f}{small_out / dt:>14.0f}{small_total / dt:>13.0f}")
        finally:
            llm.close()
    if not hf_seqs:
        return
    dt = run_hf(path, small, batch=hf_seqs)
    log(f"{'HF transformers generate':<28}{hf_seqs:>6}{dt:>10.2f}{small_out / dt:>14.0f}{small_total / dt:>13.0f}")
    log("   (HF: one left-padded batch run to its longest output; tok/s counts only the tokens asked for)")


DECODE_TOKENS = 100  # per sequence: enough for warm-up and timed steps while others still prefill

# ---- decode step vs roofline ---------------------------------------------------------------------
def weight_bytes(llm: LLM) -> int:
    return sum(p.numel() * p.element_size() for p in llm.engine.runner.model.parameters())


def roofline_ms(llm: LLM, batch: int, context: int, bandwidth: float) -> float:
    """The decode step's floor: the weights and `batch` sequences' KV of about `context` tokens (plus the steps
    `decode_step_ms` runs first) read once at `bandwidth` GB/s (a copy's read + write)."""
    layout = llm.engine.runner.layout
    kv_per_token = layout.block_bytes // layout.block_size
    return (weight_bytes(llm) + batch * (context + 20) * kv_per_token) / (bandwidth * 1e9) * 1e3


def step_per_mode(path: Path, modes: list[str], set_mode: Callable[[str], None], batch: int = 64,
                  context: int = 1024, rounds: int = 2) -> Iterator[tuple[str, float, float]]:
    """(mode, step ms, roofline ms) of a fresh engine per mode, the modes alternated `rounds` times: the GPU probes'
    A/B of one engine with its kernels swapped by `set_mode` (left at "engine" after)."""
    bw = hbm_bandwidth()
    try:
        for mode in modes * rounds:
            set_mode(mode)
            llm = make_llm(path, max_num_seqs=256, max_model_len=context + 300)
            try:
                yield mode, decode_step_ms(llm, batch, context), roofline_ms(llm, batch, context, bw)
            finally:
                llm.close()
    finally:
        set_mode("engine")


def start_decodes(llm: LLM, batch: int, context: int, max_tokens: int) -> list[str]:
    """`batch` sequences of `context` prompt tokens, all past their prefill."""
    rng = random.Random(batch)
    engine, rids = llm.engine, [f"d{i}" for i in range(batch)]
    for rid in rids:
        engine.add_request(rid, [rng.randint(0, 500) for _ in range(context)],
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed() > 1 for s in sched.running):
        engine.step()
    for _ in range(3):
        engine.step()
    return rids


def decode_step_ms(llm: LLM, batch: int, context: int, steps: int = 30) -> float:
    engine = llm.engine
    rids = start_decodes(llm, batch, context, DECODE_TOKENS)
    t0 = sync_time()
    for _ in range(steps):
        engine.step()
        assert engine.last_step.num_prefill_tokens == 0 and engine.last_step.num_decode_tokens == batch
    dt = (sync_time() - t0) / steps
    for rid in rids:
        engine.abort(rid)
    return dt * 1e3


def decode_idle(llm: LLM, batch: int, context: int, steps: int = 30) -> tuple[float, float, float]:
    """GPU idle between decode steps, read off CUDA events on the compute stream (no profiler): the share
    of the wall time in which the stream had finished step N and the CPU had not yet queued step N+1's
    launch (low), or its forward (high: also counts the step's input upload and PENDING-token gather, a
    few microseconds of GPU work). Returns (ms per step, low, high)."""
    engine, runner = llm.engine, llm.engine.runner
    rids = start_decodes(llm, batch, context, DECODE_TOKENS)
    marks: list[dict[str, torch.cuda.Event]] = []

    def mark(name: str) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        marks[-1][name] = event

    # `_sample` queues the forward (a graph replay, or `execute`) then the sampler: both paths pass through it
    launch, sample = runner.launch, runner._sample

    def timed_launch(b):
        marks.append({})
        mark("launch")
        out = launch(b)
        mark("end")
        return out

    def timed_sample(inputs, sampling):
        mark("forward")
        return sample(inputs, sampling)

    runner.launch, runner._sample = timed_launch, timed_sample
    try:
        t0 = sync_time()
        for _ in range(steps):
            engine.step()
        wall = sync_time() - t0
    finally:
        runner.launch, runner._sample = launch, sample
    for rid in rids:
        engine.abort(rid)
    span = marks[0]["launch"].elapsed_time(marks[-1]["end"])
    low = sum(max(0.0, a["end"].elapsed_time(b["launch"])) for a, b in zip(marks, marks[1:]))
    high = sum(max(0.0, a["end"].elapsed_time(b["forward"])) for a, b in zip(marks, marks[1:]))
    return wall / steps * 1e3, low / span, high / span


def decode_step_phases(llm: LLM, batch: int, context: int, steps: int = 20) -> dict[str, float]:
    """Where a decode step's time goes (ms, synchronised after each phase). The LM head (in "forward") and the
    sampler run eagerly, as in a step with top-k or top-p rows; a one-pass step replays both as a graph
    (common/engine/sampler_graph.py), which these phases cannot split."""
    from common.engine.layers.sampler import sample
    from common.engine.step_inputs import unpack_step
    from common.engine.upload import upload

    engine, runner = llm.engine, llm.engine.runner
    rids = start_decodes(llm, batch, context, DECODE_TOKENS)
    phases = dict.fromkeys(["schedule", "pack+h2d", "unpack", "forward", "sample", "postprocess"], 0.0)
    with torch.inference_mode():
        for _ in range(steps):
            t = [sync_time()]
            b = engine.scheduler.schedule()
            t.append(sync_time())
            step = runner.pack(b)
            payload = step.payload.to(runner.device, non_blocking=True)
            t.append(sync_time())
            inputs = unpack_step(step.header, payload)
            t.append(sync_time())
            logits = runner.execute(inputs)
            t.append(sync_time())
            sampling = runner._sampling_batch(b.seqs)
            tokens = sample(logits, sampling.uploaded(upload(sampling.tensors(), runner.device))).tolist()
            t.append(sync_time())
            engine.scheduler.resolve(b, engine.scheduler.advance(b), tokens)
            t.append(sync_time())
            for name, a, z in zip(phases, t, t[1:]):
                phases[name] += (z - a) * 1e3 / steps
    for rid in rids:
        engine.abort(rid)
    return phases


def profile_decode(root: Path, config: str, context: int, batch: int, overlap: bool, steps: int = 10) -> None:
    """GPU kernels of `steps` decode steps (CUDA graphs on), by total time: where a step's GPU time goes.
    Only CUDA activity is traced: tracing CPU ops would slow the CPU side and inflate the GPU's idle time."""
    from torch.profiler import ProfilerActivity, profile

    path = model_dir(config, root)
    llm = make_llm(path, max_num_seqs=max(batch, 8), max_model_len=context + DECODE_TOKENS + 16,
                   overlap_scheduling=overlap)
    try:
        rids = start_decodes(llm, batch, context, DECODE_TOKENS)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = sync_time()
            for _ in range(steps):
                llm.engine.step()
            wall = (sync_time() - t0) / steps
        events = cuda_kernels(prof)
        gpu_us = sum(e.self_device_time_total for e in events) / steps
        log(f"== profile: {config}, batch {batch}, context {context}, overlap {overlap}: "
            f"wall {wall * 1e3:.3f} ms/step, "
            f"GPU busy {gpu_us / 1e3:.3f} ms/step ({gpu_us / 1e3 / (wall * 1e3):.0%})")
        log(f"{'kernel':<90}{'calls/step':>11}{'us/step':>10}")
        for e in events[:25]:
            log(f"{e.key[:88]:<90}{e.count / steps:>11.1f}{e.self_device_time_total / steps:>10.1f}")
        for rid in rids:
            llm.engine.abort(rid)
    finally:
        llm.close()


# --modes name: (row label, engine settings)
DECODE_MODES = {"graphs": ("graphs", {}), "no-overlap": ("graphs, no overlap", {"overlap_scheduling": False}),
                "eager": ("eager", {"enforce_eager": True})}


def bench_decode(root: Path, config: str, context: int, modes: list[str] = list(DECODE_MODES),
                 batches: tuple[int, ...] = (1, 64, 256)) -> None:
    path = model_dir(config, root)
    bw = hbm_bandwidth()
    log(f"== decode step, {config} bf16, context {context} tokens/seq; device copy bandwidth {bw:.0f} GB/s "
        "(read + write)")
    log("   roofline = (weight bytes + KV bytes read) / copy bandwidth (read + write)")
    log(f"   {WARM}")
    log(f"{'mode':<20}{'batch':>6}{'step ms':>10}{'roofline ms':>13}{'x roofline':>12}{'tok/s':>10}")
    for name, kw in (DECODE_MODES[m] for m in modes):
        llm = make_llm(path, max_num_seqs=256, max_model_len=context + DECODE_TOKENS + 16, **kw)
        try:
            for batch in batches:
                ms = decode_step_ms(llm, batch, context)
                roof = roofline_ms(llm, batch, context, bw)
                log(f"{name:<20}{batch:>6}{ms:>10.3f}{roof:>13.3f}{ms / roof:>12.2f}{batch / ms * 1e3:>10.0f}")
                assert llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks
            if name != "eager":
                for batch in batches:
                    ms, low, high = decode_idle(llm, batch, context)
                    log(f"   {name} batch {batch}: GPU idle between steps {low:.1%} .. {high:.1%} of {ms:.3f} ms/step "
                        "(CUDA events)")
            for batch in (1, 256) if name == "graphs, no overlap" else ():
                phases = decode_step_phases(llm, batch, context)
                log(f"   {name} batch {batch} phases (ms, synchronised): "
                    + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
        finally:
            llm.close()


# ---- prefill tok/s and MFU -----------------------------------------------------------------------
def prefill_flops(llm: LLM, n: int) -> float:
    """2 * matmul params * tokens, plus causal attention (QK^T and PV over half the square). The embedding is
    a lookup and the LM head runs on the last token only: neither counts."""
    mc = llm.engine.config.model_config
    model = llm.engine.runner.model
    heads = {id(model.model.embed_tokens.weight), id(model.lm_head.weight)}
    matmul_params = sum(p.numel() for p in model.parameters() if p.dim() == 2 and id(p) not in heads)
    attn = 2 * 2 * mc.num_layers * mc.num_heads * mc.head_dim * n * n / 2
    return 2 * matmul_params * n + attn


def bench_prefill(root: Path, config: str) -> None:
    path = model_dir(config, root)
    peak = peak_tflops()
    log(f"== prefill, {config} bf16, one prompt per step; MFU against {peak:.0f} TFLOP/s dense bf16 "
        f"({torch.cuda.get_device_name()})")
    log(f"{'tokens':>7}{'ms':>10}{'tok/s':>11}{'TFLOP/s':>10}{'MFU':>7}")
    llm = make_llm(path, max_num_batched_tokens=16384, max_model_len=16384 + 16, max_num_seqs=16,
                   enforce_eager=True, enable_prefix_caching=False)
    try:
        engine = llm.engine
        for n in (1024, 4096, 16384):
            rng = random.Random(n)
            times = []
            for rep in range(4):
                engine.add_request(f"p{rep}", [rng.randint(0, 500) for _ in range(n)],
                                   SamplingParams(max_tokens=1, ignore_eos=True))
                t0 = sync_time()
                engine.step()
                times.append(sync_time() - t0)
                assert engine.last_step.num_prefill_tokens == n
            dt = sorted(times[1:])[len(times[1:]) // 2]  # median after warm-up
            tflops = prefill_flops(llm, n) / dt / 1e12
            log(f"{n:>7}{dt * 1e3:>10.2f}{n / dt:>11.0f}{tflops:>10.1f}{tflops / peak:>7.0%}")
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench_engine", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["throughput", "decode", "prefill", "profile", "all"])
    ap.add_argument("--batch", type=int, default=64, help="profile: decode batch size")
    ap.add_argument("--no-overlap", action="store_true", help="profile: without overlapped scheduling")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--hf-seqs", type=int, default=32)
    ap.add_argument("--config", default=None, help="model config (default: qwen3-0.6b decode, qwen3-8b prefill)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tp", type=int, default=1, help="throughput: tensor-parallel size (no eager or HF runs)")
    ap.add_argument("--modes", default=",".join(DECODE_MODES),
                    help=f"decode: comma list of {', '.join(DECODE_MODES)} (default: all)")
    ap.add_argument("--batches", default="1,64,256", help="decode: comma list of batch sizes")
    args = ap.parse_args(argv)
    require_gpus("bench_engine")
    log(device_summary())
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.what == "profile":
            profile_decode(root, args.config or "qwen3-0.6b", args.context, args.batch, not args.no_overlap)
        if args.what in ("decode", "all"):
            modes = [m.strip() for m in args.modes.split(",") if m.strip()]
            if not modes or any(m not in DECODE_MODES for m in modes):
                raise SystemExit(f"bench_engine: --modes takes {', '.join(DECODE_MODES)}, got {args.modes!r}")
            bench_decode(root, args.config or "qwen3-0.6b", args.context, modes,
                         tuple(int(b) for b in args.batches.split(",")))
        if args.what in ("prefill", "all"):
            bench_prefill(root, args.config or "qwen3-8b")
        if args.what in ("throughput", "all"):
            bench_throughput(root, args.num_seqs, 0 if args.tp > 1 else args.hf_seqs, args.tp)


if __name__ == "__main__":
    main()
