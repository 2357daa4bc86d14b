"""Probe (stop 23): how fast can batch-64 decode attention read the KV cache? Qwen3-0.6B's shapes (16 query heads,
8 KV heads, head_dim 128, 28 layers, pages of 16), 64 sequences of 1024 tokens, the engine's block-major pool.
Times 28 layers' attention in one CUDA graph for:
- the engine's kernel under other launches (keys a tile, warps, stages) and finer plans (units a sequence);
- a variant that loads each page's K and V with the bulk tensor copy engine (TMA) through host descriptors;
- reference read and copy rates of the same memory.
Prints us a step, TB/s of KV read, and each compiled variant's registers and shared memory.

    PYTHONPATH=... python docs/gpu_runs/stop23_attn_probe.py [--quick]
"""
from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from common.engine.attention import triton_ops
from common.engine.attention.decode_plan import PLAN_ROWS, DecodePlan
from common.engine.attention.triton_ops import DecodeLaunch, paged_decode_attention
from scripts.bench_gpu import graph_us

LAYERS, HQ, HKV, D, PAGE = 28, 16, 8, 128, 16
CUDA = torch.cuda.is_available()
dev = torch.device("cuda" if CUDA else "cpu")
QUICK = "--quick" in sys.argv or not CUDA
BATCH, CONTEXT = (64, 1024) if not QUICK else (3, 40)
LAYERS = LAYERS if not QUICK else 2
# The interpreter's tl.dot gives garbage for bf16 (tests/test_triton_ops.py): the CPU check runs fp16.
DTYPE = torch.bfloat16 if CUDA else torch.float16


@triton.jit
def _decode_tma_kernel(q_ptr, k_desc, v_desc, block_tables_ptr, seq_lens_ptr, out_ptr, qk_scale,
                       stride_qb, stride_qh, stride_btb, stride_ob, stride_oh,
                       GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
                       PAGES: tl.constexpr):
    """Grid (batch, kv_heads), one program a sequence: PAGES pages a tile, each page's keys one TMA box."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    end = tl.load(seq_lens_ptr + seq)
    g = tl.arange(0, BLOCK_G)
    head_mask = g < GROUP
    heads = kv_head * GROUP + g
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :], mask=head_mask[:, None], other=0.0)
    table = block_tables_ptr + seq.to(tl.int64) * stride_btb
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    offs = tl.arange(0, PAGE * PAGES)
    TILE: tl.constexpr = PAGE * PAGES
    for n0 in range(0, end, TILE):
        p0 = n0 // PAGE
        page = tl.load(table + p0)
        k = k_desc.load([page, 0, kv_head, 0]).reshape(PAGE, HEAD_DIM)
        v = v_desc.load([page, 0, kv_head, 0]).reshape(PAGE, HEAD_DIM)
        if PAGES == 2:
            page1 = tl.load(table + p0 + 1)
            k1 = k_desc.load([page1, 0, kv_head, 0]).reshape(PAGE, HEAD_DIM)
            v1 = v_desc.load([page1, 0, kv_head, 0]).reshape(PAGE, HEAD_DIM)
            k = tl.join(k, k1).permute(2, 0, 1).reshape(TILE, HEAD_DIM)
            v = tl.join(v, v1).permute(2, 0, 1).reshape(TILE, HEAD_DIM)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where((n0 + offs)[None, :] < end, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :], o.to(out_ptr.dtype.element_ty),
             mask=head_mask[:, None])


def tma_attention(q, k_desc, v_desc, block_tables, seq_lens, scale, out, pages=1, warps=4, stages=4):
    _decode_tma_kernel[(q.shape[0], HKV)](
        q, k_desc, v_desc, block_tables, seq_lens, out, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=HQ // HKV, BLOCK_G=16, HEAD_DIM=D, PAGE=PAGE, PAGES=pages, num_warps=warps, num_stages=stages)
    return out


def fixed_plan(batch: int, context: int, unit: int) -> DecodePlan:
    """Every sequence cut into units of `unit` tokens."""
    n = -(-context // unit)
    seqs = [i for i in range(batch) for _ in range(n)]
    starts = [k * unit for _ in range(batch) for k in range(n)]
    ends = [min((k + 1) * unit, context) for _ in range(batch) for k in range(n)]
    table = torch.tensor([seqs, starts, ends, [i * n for i in range(batch)] + [0] * (len(seqs) - batch),
                          [n] * batch + [0] * (len(seqs) - batch)], dtype=torch.int32, device=dev)
    assert table.shape[0] == PLAN_ROWS
    return DecodePlan(table, True)


def timed(fn, reps=30) -> float:
    """us a call of fn, replayed from a CUDA graph (on CPU: one plain call, 0)."""
    if not CUDA:
        fn()
        return 0.0
    return graph_us(fn, reps)


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, 0))


def compiled_info(fn) -> list[str]:
    rows = []
    for cache in getattr(fn, "device_caches", {}).values():
        kernels = cache[0] if isinstance(cache, tuple) else cache
        for k in kernels.values():
            rows.append(f"regs {getattr(k, 'n_regs', '?')} spills {getattr(k, 'n_spills', '?')} "
                        f"shared {getattr(k.metadata, 'shared', '?')} warps {getattr(k.metadata, 'num_warps', '?')} "
                        f"stages {getattr(k.metadata, 'num_stages', '?')}")
    return rows


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name() if CUDA else "cpu (interpreter check)", flush=True)
    pages_per_seq = -(-CONTEXT // PAGE)
    num_blocks = BATCH * pages_per_seq + 8
    kv = torch.randn(num_blocks, LAYERS, 2, PAGE, HKV, D, device=dev, dtype=DTYPE)
    q = torch.randn(BATCH, HQ, D, device=dev, dtype=DTYPE)
    seq_lens = torch.full((BATCH,), CONTEXT, dtype=torch.int32, device=dev)
    contiguous = torch.arange(BATCH * pages_per_seq, dtype=torch.int32, device=dev).view(BATCH, pages_per_seq)
    shuffled = torch.randperm(BATCH * pages_per_seq, device=dev).to(torch.int32).view(BATCH, pages_per_seq)
    width = pages_per_seq + 1
    tables = {name: torch.cat([t, torch.zeros(BATCH, width - pages_per_seq, dtype=torch.int32, device=dev)], 1)
              for name, t in (("contiguous", contiguous), ("shuffled", shuffled))}
    scale = D ** -0.5
    outs = [torch.empty_like(q) for _ in range(LAYERS)]
    kv_bytes = BATCH * CONTEXT * LAYERS * 2 * HKV * D * 2

    def engine(launch, plan, table):
        def fn():
            for layer in range(LAYERS):
                paged_decode_attention(q, kv[:, layer, 0], kv[:, layer, 1], table, seq_lens, scale, out=outs[layer],
                                       plan=plan, launch=launch)
        return fn

    descs = [(TensorDescriptor.from_tensor(kv[:, layer, 0], [1, PAGE, 1, D]),
              TensorDescriptor.from_tensor(kv[:, layer, 1], [1, PAGE, 1, D])) for layer in range(LAYERS)]

    def tma(table, pages, warps, stages):
        def fn():
            for layer in range(LAYERS):
                tma_attention(q, *descs[layer], table, seq_lens, scale, outs[layer], pages, warps, stages)
        return fn

    # Correctness of the variant against the engine's kernel.
    ref = paged_decode_attention(q, kv[:, 0, 0], kv[:, 0, 1], tables["shuffled"], seq_lens, scale)
    keys = kv[:, 0, 0][tables["shuffled"][:, :pages_per_seq].long()].flatten(1, 2)[:, :CONTEXT].float()
    values = kv[:, 0, 1][tables["shuffled"][:, :pages_per_seq].long()].flatten(1, 2)[:, :CONTEXT].float()
    group = HQ // HKV
    scores = torch.einsum("bhd,bthd->bht", q.float(), keys.repeat_interleave(group, 2)) * scale
    dense = torch.einsum("bht,bthd->bhd", scores.softmax(-1), values.repeat_interleave(group, 2))
    print(f"check engine: max |engine - dense| {(ref.float() - dense).abs().max():.5f}")
    for pages in (1, 2):
        got = tma_attention(q, *descs[0], tables["shuffled"], seq_lens, scale, torch.empty_like(q), pages)
        print(f"check tma pages={pages}: max |tma - dense| {(got.float() - dense).abs().max():.5f}", flush=True)
    if not CUDA:
        return

    def report(name, us):
        print(f"{name:<44} {us:9.1f} us a step  {kv_bytes / us / 1e6:6.3f} TB/s", flush=True)

    # Reference rates over the same pool.
    flat = kv.view(-1)
    src, dst = flat[: flat.numel() // 2], flat[flat.numel() // 2:]
    us = timed(lambda: dst.copy_(src), reps=10)
    print(f"{'copy (read + write) of half the pool':<44} {us:9.1f} us  {2 * src.numel() * 2 / us / 1e6:6.3f} TB/s")
    partial = torch.empty(flat.numel() // (4096 * 64) + 1, device=dev, dtype=torch.float32)
    for block, iters in ((4096, 64), (2048, 32), (8192, 16)):
        grid = triton.cdiv(flat.numel(), block * iters)
        us = timed(lambda: _read_kernel[(grid,)](flat, partial, flat.numel(), BLOCK=block, ITERS=iters, num_warps=8),
                   reps=10)
        print(f"{f'read-only sum, {block} x {iters} a program':<44} {us:9.1f} us  {flat.numel() * 2 / us / 1e6:6.3f} TB/s")
    default = triton_ops.decode_launch(DTYPE)
    for table_name in ("contiguous", "shuffled"):
        report(f"engine {default} {table_name}", timed(engine(default, DecodePlan(None, False), tables[table_name])))
    table = tables["shuffled"]
    for bn, warps, stages in ((64, 4, 3), (64, 4, 4), (64, 8, 2), (64, 8, 3), (128, 4, 2), (128, 8, 2), (32, 4, 2), (32, 4, 3),
                              (32, 4, 4), (32, 2, 3), (16, 4, 4), (16, 2, 4)):
        launch = DecodeLaunch(bn, warps, stages)
        try:
            report(f"engine {bn}/{warps}/{stages}", timed(engine(launch, DecodePlan(None, False), table)))
        except Exception as exc:  # noqa: BLE001 (a launch that does not fit: say so, go on)
            print(f"engine {bn}/{warps}/{stages}: {type(exc).__name__}: {str(exc)[:100]}")
    for unit in (512, 256):
        report(f"engine {default} units of {unit}", timed(engine(default, fixed_plan(BATCH, CONTEXT, unit), table)))
    for pages, warps, stages in ((1, 4, 4), (1, 4, 6), (1, 4, 8), (1, 2, 6), (2, 4, 3), (2, 4, 4), (2, 4, 6)):
        try:
            report(f"tma pages={pages} warps={warps} stages={stages}", timed(tma(table, pages, warps, stages)))
        except Exception as exc:  # noqa: BLE001
            print(f"tma {pages}/{warps}/{stages}: {type(exc).__name__}: {str(exc)[:200]}")
    print("compiled engine decode kernels:", *compiled_info(triton_ops._decode_kernel), sep="\n  ")
    print("compiled tma kernels:", *compiled_info(_decode_tma_kernel), sep="\n  ")


if __name__ == "__main__":
    main()
