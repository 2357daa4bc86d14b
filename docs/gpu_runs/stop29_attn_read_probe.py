"""Probe (stop 29): why the batch-64 decode attention streams KV at ~3.9 TB/s where a plain read reaches ~4.4.

One layer of Qwen3-0.6B decode attention, 64 sequences of 1,024 tokens, KV in the engine's pool layout
([blocks, 28 layers, K/V, 16 tokens, 8 KV heads, 128]: a KV head's token is 256 B, 2 KB from the next token's).
Times, replayed from a CUDA graph, us and GB/s of KV:
- the engine's kernel (`paged_decode_attention`, one program a sequence and KV head);
- the same kernel body with the grid's axes swapped (the 8 heads of a sequence launched next to each other);
- a read-only kernel with the same addressing (loads and sums K and V, no attention), both grid orders;
- a contiguous read of as many bytes;
and each compiled kernel's registers and shared memory, and the programs an SM can hold.

    PYTHONPATH=... python docs/gpu_runs/stop29_attn_read_probe.py
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.engine.attention import torch_ops, triton_ops
from scripts.bench_gpu import graph_us

LAYERS, BLOCK, HKV, HQ, D = 28, 16, 8, 16, 128
BATCH, CONTEXT = 64, 1024
dev = torch.device("cuda")


@triton.jit
def _attn_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, out_ptr, qk_scale, stride_qb, stride_qh, stride_kb,
                 stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, stride_btb, stride_ob, stride_oh,
                 GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                 BLOCK_N: tl.constexpr, SWAP: tl.constexpr, READ_ONLY: tl.constexpr):
    """The engine's decode kernel body (DIRECT: a program a sequence and KV head); SWAP: grid (heads, seqs)."""
    if SWAP:
        kv_head, seq = tl.program_id(0), tl.program_id(1)
    else:
        seq, kv_head = tl.program_id(0), tl.program_id(1)
    end = tl.load(lens_ptr + seq)
    g = tl.arange(0, BLOCK_G)
    head_mask = g < GROUP
    heads = kv_head * GROUP + g
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None],
                other=0.0)
    k_ptr += kv_head * stride_kh
    v_ptr += kv_head * stride_vh
    bt = bt_ptr + seq.to(tl.int64) * stride_btb
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    total = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for n0 in range(0, end, BLOCK_N):
        pos = n0 + offs_n
        if READ_ONLY:
            page = tl.load(bt + pos // PAGE).to(tl.int64)
            off = (pos % PAGE)[:, None]
            k = tl.load(k_ptr + page[:, None] * stride_kb + off * stride_kt + dims[None, :])
            v = tl.load(v_ptr + page[:, None] * stride_vb + off * stride_vt + dims[None, :])
            total += tl.sum(k.to(tl.float32) + v.to(tl.float32), 0)
        else:
            acc, m_i, l_i = triton_ops._attend_tile(q, acc, m_i, l_i, k_ptr, v_ptr, bt, pos, None, None,
                                                    stride_kb, stride_kt, stride_vb, stride_vt, qk_scale,
                                                    HEAD_DIM, PAGE, False, "tf32")
    if READ_ONLY:
        o = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32) + total[None, :]
    else:
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :], o.to(out_ptr.dtype.element_ty),
             mask=head_mask[:, None])


@triton.jit
def _read_kernel(src_ptr, sink_ptr, n, BLOCK: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * BLOCK * 4
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(4):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src_ptr + offs, mask=offs < n, other=0)
    if tl.sum(acc) == 0x5EED1234:
        tl.store(sink_ptr, 0)


def occupancy(kernel, warps: int) -> str:
    props = torch.cuda.get_device_properties(dev)
    regs, smem = kernel.n_regs, kernel.metadata.shared
    by_regs = 65536 // max(1, regs * 32 * warps)
    by_smem = props.shared_memory_per_multiprocessor // max(1, smem) if smem else 99
    by_warps = 64 // warps
    return f"{regs} regs, {smem} B shared: {min(by_regs, by_smem, by_warps, 32)} programs an SM " \
           f"(regs {by_regs}, shared {by_smem}, warps {by_warps})"


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), flush=True)
    per_seq = CONTEXT // BLOCK
    num_blocks = BATCH * per_seq + 64
    pool = torch.randn(num_blocks, LAYERS, 2, BLOCK, HKV, D, dtype=torch.bfloat16, device=dev)
    k_cache, v_cache = pool[:, 0, 0], pool[:, 0, 1]
    tables = torch.randperm(num_blocks, device=dev)[:BATCH * per_seq].view(BATCH, per_seq).to(torch.int32)
    lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device=dev)
    q = torch.randn(BATCH, HQ, D, dtype=torch.bfloat16, device=dev)
    out = torch.empty_like(q)
    scale = D ** -0.5
    gbytes = BATCH * CONTEXT * 2 * HKV * D * 2 / 1e9
    plan = triton_ops.plan_decode([CONTEXT] * BATCH, HKV, dev)
    ref = torch_ops.paged_decode_attention(q[:2], k_cache, v_cache, tables[:2], lens[:2], scale)

    def report(name: str, us: float) -> None:
        print(f"{name}: {us:.1f} us, {gbytes / us * 1e6:.0f} GB/s", flush=True)

    engine = lambda: triton_ops.paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out=out, plan=plan)
    engine()
    print(f"engine kernel split: {plan.split}; max |err| {(out[:2].float() - ref.float()).abs().max().item():.4f}")
    report("engine kernel", graph_us(engine, reps=50))
    for read_only in (0, 1):
        for swap in (0, 1):
            for block_n, warps, stages in ((64, 4, 2), (64, 4, 3), (32, 4, 3), (128, 8, 2)):
                grid = (HKV, BATCH) if swap else (BATCH, HKV)

                def run():
                    return _attn_kernel[grid](
                        q, k_cache, v_cache, tables, lens, out, scale * 1.4426950408889634, q.stride(0), q.stride(1),
                        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
                        v_cache.stride(2), tables.stride(0), out.stride(0), out.stride(1), GROUP=HQ // HKV, BLOCK_G=16,
                        HEAD_DIM=D, PAGE=BLOCK, BLOCK_N=block_n, SWAP=swap, READ_ONLY=read_only, num_warps=warps,
                        num_stages=stages)

                try:
                    kernel = run()
                except triton.runtime.errors.OutOfResources as e:
                    print(f"tile {block_n}/{warps}/{stages}: {e}")
                    continue
                err = "" if read_only else f", max |err| {(out[:2].float() - ref.float()).abs().max().item():.4f}"
                name = (f"{'read-only' if read_only else 'attention'} {'heads-first' if swap else 'seqs-first'} "
                        f"tile {block_n}/{warps}w/{stages}st ({occupancy(kernel, warps)}{err})")
                report(name, graph_us(run, reps=50))
    flat = torch.empty(int(gbytes * 1e9) // 4, dtype=torch.int32, device=dev).fill_(1)
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    report("contiguous read of as many bytes",
           graph_us(lambda: _read_kernel[(triton.cdiv(flat.numel(), 8192),)](flat, sink, flat.numel(), BLOCK=2048,
                                                                              num_warps=8), reps=50))


if __name__ == "__main__":
    main()
