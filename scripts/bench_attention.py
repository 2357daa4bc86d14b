"""Benchmark the Triton attention kernels on one GPU (about 1-2 minutes on an H100).

    python -m scripts.bench_attention            # decode, prefill and store kernels vs copy bandwidth
    python -m scripts.bench_attention --mixed    # decode of one long context among short ones: plan vs even splits
    python -m scripts.bench_attention --sweep    # decode launch settings at the engine's shapes (~3 min)

Every case first checks the kernel against torch_ops (max abs err), then times it with
triton.testing.do_bench (median, L2 flushed between runs). K/V live in one shared pool laid out
[num_blocks, num_layers=1, 2, block_size, Hkv, D] with shuffled block ids.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os

import torch
import triton

from common.engine.attention import torch_ops, triton_ops
from common.engine.attention.decode_plan import DecodePlan, plan_decode, wave_units
from scripts.bench_gpu import bench_ms, device_summary, hbm_bandwidth, log, require_gpus

DTYPE = torch.bfloat16
MODELS = {"qwen3-0.6b": (16, 8, 128), "qwen3-8b": (32, 8, 128)}  # (Hq, Hkv, D)
NUM_KV_HEADS, HEAD_DIM = 8, 128
BLOCK_SIZES = (16, 256)
DECODE_BATCHES = (1, 64, 256)
DECODE_CONTEXTS = (512, 4096, 32768)
PREFILL_TOKENS = (1024, 4096, 16384)
STORE_TOKENS = (256, 4096, 16384)
CHECK_SEQS = 4  # decode: sequences checked against torch_ops
CHECK_QUERIES = 256  # prefill: trailing queries checked against torch_ops


class Pool:
    """One K/V allocation viewed with any block size; hands out shuffled blocks."""

    def __init__(self, batch: int, context: int) -> None:
        """Room for `batch` sequences of `context` tokens at any of BLOCK_SIZES."""
        num_tokens = batch * -(-context // max(BLOCK_SIZES)) * max(BLOCK_SIZES)
        self.storage = torch.empty(num_tokens * 2 * NUM_KV_HEADS * HEAD_DIM, dtype=DTYPE, device="cuda").normal_()

    def caches(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = self.storage.view(-1, 1, 2, block_size, NUM_KV_HEADS, HEAD_DIM)
        return kv[:, 0, 0], kv[:, 0, 1]

    def block_tables(self, batch: int, context: int, block_size: int) -> torch.Tensor:
        per_seq = -(-context // block_size)
        num_blocks = self.storage.numel() // (2 * block_size * NUM_KV_HEADS * HEAD_DIM)
        ids = torch.randperm(num_blocks, device="cuda")[:batch * per_seq]
        return ids.view(batch, per_seq).to(torch.int32)


def num_units(plan: DecodePlan, batch: int) -> int:
    """Programs a plan runs per KV head: one a sequence, or its table's used units."""
    return int((plan.units[0] >= 0).sum()) if plan.split else batch


def bench_decode(pool: Pool, copy_gbs: float) -> None:
    log(f"\n== paged_decode_attention ({DTYPE}), KV read GB/s vs copy {copy_gbs:.0f} GB/s")
    log(f"{'model':<11} {'block':>5} {'batch':>5} {'context':>7} {'units':>6} {'max_err':>8} "
        f"{'us':>9} {'GB/s':>7} {'%copy':>6}")
    for model, (num_heads, _, _) in MODELS.items():
        for block_size in BLOCK_SIZES:
            k_cache, v_cache = pool.caches(block_size)
            for batch in DECODE_BATCHES:
                for context in DECODE_CONTEXTS:
                    tables = pool.block_tables(batch, context, block_size)
                    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
                    q = torch.randn(batch, num_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
                    out = torch.empty_like(q)
                    scale = HEAD_DIM ** -0.5
                    plan = plan_decode([context] * batch, NUM_KV_HEADS, q.device)

                    def run() -> torch.Tensor:
                        return triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out=out,
                                                                 plan=plan)

                    n = min(batch, CHECK_SEQS)
                    expected = torch_ops.paged_decode_attention(q[:n], k_cache, v_cache, tables[:n], lens[:n], scale)
                    err = (run()[:n].float() - expected.float()).abs().max().item()
                    ms = bench_ms(run)
                    gbs = batch * context * 2 * NUM_KV_HEADS * HEAD_DIM * q.element_size() / ms / 1e6
                    units = num_units(plan, batch)
                    log(f"{model:<11} {block_size:>5} {batch:>5} {context:>7} {units:>6} {err:>8.1e} "
                        f"{ms * 1e3:>9.1f} {gbs:>7.0f} {100 * gbs / copy_gbs:>5.0f}%")


# One long context among short ones, as a serving batch holds them (long-prompt requests decoding beside
# chat turns): the plan against every sequence cut the same number of ways (the rule before decode plans).
MIXED = [(b, short, long) for b in (4, 16, 64) for short, long in ((400, 8192), (400, 32768))]


def even_plan(lens: list[int], splits: int, device: torch.device) -> DecodePlan:
    """Every sequence cut into `splits` equal units (tiles of 64): the split rule before decode plans."""
    rows = [[], [], [], [], []]
    for i, n in enumerate(lens):
        per = -(-(-(-n // splits)) // 64) * 64
        units = -(-n // per)
        rows[3].append(len(rows[0]))
        rows[4].append(units)
        for k in range(units):
            rows[0].append(i), rows[1].append(k * per), rows[2].append(min((k + 1) * per, n))
    width = len(rows[0])
    table = torch.full((5, width), -1, dtype=torch.int32)
    for r, values in enumerate(rows):
        table[r, :len(values)] = torch.tensor(values, dtype=torch.int32)
    return DecodePlan(table.to(device), splits > 1)


def bench_mixed(copy_gbs: float) -> None:
    log(f"\n== paged_decode_attention, one long context among short ones ({DTYPE}, qwen3-8b heads, block 16)")
    log(f"{'batch':>5} {'short':>6} {'long':>6} | {'even splits':>11} {'us':>8} | {'plan units':>10} {'us':>8} "
        f"{'%copy':>6} {'gain':>6}")
    num_heads = MODELS["qwen3-8b"][0]
    scale = HEAD_DIM ** -0.5
    for batch, short, long in MIXED:
        lens_list = [short] * (batch - 1) + [long]
        pool = Pool(batch, long)
        k_cache, v_cache = pool.caches(16)
        tables = pool.block_tables(batch, long, 16)
        lens = torch.tensor(lens_list, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, num_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
        out = torch.empty_like(q)
        # the old rule: splits from the batch and the table width only, as many as keep one wave
        old = max(1, min(wave_units(NUM_KV_HEADS, q.device) // batch, 64, -(-tables.shape[1] * 16 // 128)))
        plans = {"even": even_plan(lens_list, old, q.device), "plan": plan_decode(lens_list, NUM_KV_HEADS, q.device)}
        expected = torch_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale)
        timed = {}
        for name, plan in plans.items():
            run = lambda: triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out=out,
                                                            plan=plan)
            err = (run().float() - expected.float()).abs().max().item()
            assert err <= 2e-2, f"{name} b{batch}: max err {err}"
            timed[name] = bench_ms(run)
        gbs = sum(lens_list) * 2 * NUM_KV_HEADS * HEAD_DIM * q.element_size() / timed["plan"] / 1e6
        units = num_units(plans["plan"], batch)
        log(f"{batch:>5} {short:>6} {long:>6} | {old:>11} {timed['even'] * 1e3:>8.1f} | {units:>10} "
            f"{timed['plan'] * 1e3:>8.1f} {100 * gbs / copy_gbs:>5.0f}% {timed['even'] / timed['plan']:>6.2f}")
        del pool


def bench_prefill(pool: Pool) -> None:
    log(f"\n== paged_prefill_attention ({DTYPE}): N new tokens over an N-token cached prefix, batch 1")
    log(f"{'model':<11} {'block':>5} {'N':>6} {'max_err':>8} {'ms':>8} {'TFLOP/s':>8}")
    for model, (num_heads, _, _) in MODELS.items():
        for block_size in BLOCK_SIZES:
            k_cache, v_cache = pool.caches(block_size)
            for tokens in PREFILL_TOKENS:
                tables = pool.block_tables(1, 2 * tokens, block_size)
                lens = torch.tensor([2 * tokens], dtype=torch.int32, device="cuda")
                q = torch.randn(tokens, num_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
                starts = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
                out = torch.empty_like(q)
                scale = HEAD_DIM ** -0.5

                def run() -> torch.Tensor:
                    return triton_ops.paged_prefill_attention(q, k_cache, v_cache, starts, lens, tables, tokens,
                                                              scale, out=out)

                n = min(tokens, CHECK_QUERIES)  # the last n queries, as a q_len-n chunk over the same context
                tail = torch.tensor([0, n], dtype=torch.int32, device="cuda")
                expected = torch_ops.paged_prefill_attention(q[-n:], k_cache, v_cache, tail, lens, tables, n, scale)
                err = (run()[-n:].float() - expected.float()).abs().max().item()
                ms = bench_ms(run)
                keys_seen = tokens * tokens + tokens * (tokens + 1) // 2
                tflops = 4 * num_heads * HEAD_DIM * keys_seen / ms / 1e9
                log(f"{model:<11} {block_size:>5} {tokens:>6} {err:>8.1e} {ms:>8.3f} {tflops:>8.1f}")


def bench_store(copy_gbs: float) -> None:
    log(f"\n== store_kvcache ({DTYPE}), Hkv={NUM_KV_HEADS} D={HEAD_DIM}; GB/s = bytes read + written")
    log(f"{'block':>5} {'tokens':>6} {'max_err':>8} {'us':>8} {'GB/s':>7} {'%copy':>6}")
    for block_size in BLOCK_SIZES:
        for tokens in STORE_TOKENS:
            num_blocks = 2 * (-(-tokens // block_size)) + 1
            kv = torch.zeros(num_blocks, 2, 2, block_size, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
            expected = kv.clone()
            key, value = torch.randn(2, tokens, NUM_KV_HEADS, HEAD_DIM, dtype=DTYPE, device="cuda")
            blocks = torch.randperm(num_blocks, device="cuda")
            pos = torch.arange(tokens, device="cuda")
            slots = blocks[pos // block_size] * block_size + pos % block_size
            slots[::97] = -1
            torch_ops.store_kvcache(key, value, expected[:, 1, 0], expected[:, 1, 1], slots)

            def run() -> None:
                triton_ops.store_kvcache(key, value, kv[:, 1, 0], kv[:, 1, 1], slots)

            run()
            err = (kv.float() - expected.float()).abs().max().item()
            ms = bench_ms(run)
            gbs = 2 * 2 * key.numel() * key.element_size() / ms / 1e6
            log(f"{block_size:>5} {tokens:>6} {err:>8.1e} {ms * 1e3:>8.1f} {gbs:>7.0f} {100 * gbs / copy_gbs:>5.0f}%")


# ---- decode launch sweep ------------------------------------------------------------------------------
# The engine's decode graphs see block tables as wide as max_model_len (bench_engine: context + 116 tokens),
# not as the context: the launch heuristic must be judged at that width.
SWEEP_SHAPES = [("qwen3-0.6b", b, c) for c in (1024, 4096) for b in (1, 16, 64, 256)] + [
    ("qwen3-8b", b, 1024) for b in (1, 64)]
SWEEP_BLOCK_N, SWEEP_WARPS, SWEEP_STAGES = (32, 64, 128), (4, 8), (2, 3, 4)


def sweep_targets(batch: int, context: int) -> list[int]:
    """Plan targets (units per wave) that cut a uniform batch 1, 2, 3, 4, 8, ... ways."""
    return [batch * s for s in (1, 2, 3, 4, 8, 16, 32, 64) if batch * NUM_KV_HEADS * s <= 16384 and s * 64 <= context]


def sweep_decode(pool: Pool, copy_gbs: float, out_dir: str | None) -> None:
    log(f"\n== decode launch sweep (bf16, block 16, tables as wide as context + 116 tokens); copy {copy_gbs:.0f} GB/s")
    rows, summary = [], []
    k_cache, v_cache = pool.caches(16)
    for model, batch, context in SWEEP_SHAPES:
        num_heads = MODELS[model][0]
        width = -(-(context + 116) // 16) + 1
        tables = pool.block_tables(batch, width * 16, 16)
        lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
        q = torch.randn(batch, num_heads, HEAD_DIM, dtype=DTYPE, device="cuda")
        out = torch.empty_like(q)
        scale = HEAD_DIM ** -0.5
        n = min(batch, 2)
        expected = torch_ops.paged_decode_attention(q[:n], k_cache, v_cache, tables[:n], lens[:n], scale)
        gbytes = batch * context * 2 * NUM_KV_HEADS * HEAD_DIM * q.element_size() / 1e9
        default = (wave_units(NUM_KV_HEADS, q.device), triton_ops.decode_launch(DTYPE))
        timed = {}
        for target, block_n, warps, stages in itertools.product(sweep_targets(batch, context), SWEEP_BLOCK_N,
                                                                SWEEP_WARPS, SWEEP_STAGES):
            launch = triton_ops.DecodeLaunch(block_n, warps, stages)
            plan = plan_decode([context] * batch, NUM_KV_HEADS, q.device, target=target)
            run = lambda: triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out=out,
                                                            launch=launch, plan=plan)
            try:
                out.fill_(float("nan"))
                err = (run()[:n].float() - expected.float()).abs().max().item()
            except triton.runtime.errors.OutOfResources:
                continue
            if not err <= 2e-2:  # NaN too
                raise AssertionError(f"{model} b{batch} c{context} {launch}: max err {err}")
            timed[target, launch] = bench_ms(run, warmup=5, rep=25)
        if default not in timed:
            plan = plan_decode([context] * batch, NUM_KV_HEADS, q.device)
            timed[default] = bench_ms(lambda: triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens,
                                                                                 scale, out=out, plan=plan))
        ranked = sorted(timed.items(), key=lambda kv: kv[1])
        for (target, launch), ms in ranked:
            rows.append({"model": model, "batch": batch, "context": context, "target": target, **launch.__dict__,
                         "us": ms * 1e3, "gbs": gbytes / ms * 1e3})
        best, best_ms = ranked[0]
        summary.append((model, batch, context, default, timed[default], best, best_ms, gbytes))
        top = ", ".join(f"t{t}/n{l.block_n}/w{l.num_warps}/st{l.num_stages} {ms * 1e3:.1f}"
                        for (t, l), ms in ranked[:5])
        log(f"{model} b{batch} c{context}: {len(timed)} launches; fastest (us): {top}")
    if out_dir:
        with open(os.path.join(out_dir, "decode_sweep.json"), "w") as f:
            json.dump(rows, f)
    log(f"\n{'model':<11}{'batch':>6}{'ctx':>6} | {'default (t/n/w/st)':>18}{'us':>8}{'%copy':>6} | "
        f"{'best (t/n/w/st)':>16}{'us':>8}{'%copy':>6}{'gain':>6}")
    for model, batch, context, d, d_ms, b, b_ms, gb in summary:
        cfg = lambda tl: f"{tl[0]}/{tl[1].block_n}/{tl[1].num_warps}/{tl[1].num_stages}"
        log(f"{model:<11}{batch:>6}{context:>6} | {cfg(d):>18}{d_ms * 1e3:>8.1f}"
            f"{100 * gb / d_ms * 1e3 / copy_gbs:>5.0f}% | "
            f"{cfg(b):>16}{b_ms * 1e3:>8.1f}{100 * gb / b_ms * 1e3 / copy_gbs:>5.0f}%{d_ms / b_ms:>6.2f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="bench_attention", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", action="store_true", help="time decode launch settings at the engine's shapes")
    ap.add_argument("--mixed", action="store_true", help="only the decode of one long context among short ones")
    ap.add_argument("--out", default=None, help="--sweep: write every timing to OUT/decode_sweep.json")
    args = ap.parse_args(argv)
    require_gpus("bench_attention")
    log(device_summary())
    copy_gbs = hbm_bandwidth()
    log(f"device-to-device copy: {copy_gbs:.0f} GB/s (read + write)")
    if args.sweep:
        sweep_decode(Pool(256, 4096 + 256), copy_gbs, args.out)
        return
    bench_mixed(copy_gbs)
    if args.mixed:
        return
    pool = Pool(max(DECODE_BATCHES), max(DECODE_CONTEXTS))
    bench_decode(pool, copy_gbs)
    bench_prefill(pool)
    del pool
    bench_store(copy_gbs)


if __name__ == "__main__":
    main()
