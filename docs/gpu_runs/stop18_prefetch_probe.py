"""Probe (stop 18): does pulling the next GEMMs' weights into L2 on a side stream, while the current layer's
small kernels and attention run, shorten a decode step? Monkeypatches DecoderModel.forward of this tree and
times `bench_engine`'s decode step (Qwen3-0.6B, context 1024, graphs) per variant, alternating.

    python docs/gpu_runs/stop18_prefetch_probe.py off pf load off pf
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

from common.engine.models import llama
from scripts import bench_engine as be
from scripts.bench_gpu import hbm_bandwidth, log

LINE = 64  # bf16 elements in a 128-byte line


@triton.jit
def _prefetch_kernel(ptr, n, flag, sink, LINES: tl.constexpr, EVICT_LAST: tl.constexpr):
    pid = tl.program_id(0)
    offs = (pid.to(tl.int64) * LINES + tl.arange(0, LINES)) * 64
    mask = (offs < n).to(tl.int32)
    if EVICT_LAST:
        r = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptr + offs, mask], dtype=tl.int32, is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
            "=r,l,r", [ptr + offs, mask], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(sink + pid, tl.sum(r, 0), mask=flag != 0)


@triton.jit
def _load_kernel(ptr, n, sink, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    base = pid.to(tl.int64) * BLOCK * ITERS
    for i in tl.static_range(ITERS):
        offs = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(ptr + offs, mask=offs < n, other=0, eviction_policy="evict_last")
    tl.store(sink + pid, tl.sum(acc, 0))


class Prefetcher:
    def __init__(self, model: llama.DecoderModel, how: str):
        self.how, self.side = how, torch.cuda.Stream()
        self.sink = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
        self.per_layer = []
        layers = list(model.layers)
        for i, layer in enumerate(layers):
            ws = [layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight]
            if "mlp" in how:
                ws = ws[1:]
            if i + 1 < len(layers) and "mlp" not in how:
                ws.append(layers[i + 1].self_attn.qkv_proj.weight)
            self.per_layer.append(ws)
        self.first = [layers[0].self_attn.qkv_proj.weight]
        self.fork(0)  # compile outside any capture
        self.join()
        torch.cuda.synchronize()

    def _launch(self, ws):
        for w in ws:
            if self.how.startswith("load"):
                w32 = w.view(-1).view(torch.int32)
                n = w32.numel()
                grid = triton.cdiv(n, 1024 * 4)
                _load_kernel[(grid,)](w32, n, self.sink, BLOCK=1024, ITERS=4)
            else:
                n = w.numel()
                grid = triton.cdiv(n, LINE * 256)
                _prefetch_kernel[(grid,)](w, n, 0, self.sink, LINES=256, EVICT_LAST="keep" not in self.how)

    def fork(self, i: int) -> None:
        main = torch.cuda.current_stream()
        self.side.wait_stream(main)
        with torch.cuda.stream(self.side):
            self._launch((self.first if i == 0 else []) + self.per_layer[i])

    def join(self) -> None:
        torch.cuda.current_stream().wait_stream(self.side)


PREFETCH: Prefetcher | None = None


def forward(self, input_ids, positions):
    x, residual = self.embed_tokens(input_ids), None
    active = PREFETCH is not None and torch.cuda.is_current_stream_capturing()
    for i, layer in enumerate(self.layers):
        if active:
            PREFETCH.fork(i)
        x, residual = layer(positions, x, residual)
    if active:
        PREFETCH.join()
    x, _ = self.norm(x, residual)
    return x


def main(variants: list[str]) -> None:
    llama.DecoderModel.forward = forward
    root = Path(tempfile.mkdtemp())
    path = be.model_dir("qwen3-0.6b", root)
    bw = hbm_bandwidth()
    context = 1024
    log(f"copy bandwidth {bw:.0f} GB/s")
    from common.engine import model_runner as mr
    capture = mr.ModelRunner._capture_graphs

    def patched(self):
        global PREFETCH
        PREFETCH = None if VARIANT == "off" else Prefetcher(self.model.model, VARIANT)
        capture(self)
        PREFETCH = None

    mr.ModelRunner._capture_graphs = patched
    for v in variants:
        global VARIANT
        VARIANT = v
        llm = be.make_llm(path, max_num_seqs=256, max_model_len=context + be.DECODE_TOKENS + 16,
                          prefill_graph_max_tokens=0)
        try:
            layout = llm.engine.runner.layout
            kv_per_token = layout.block_bytes // layout.block_size
            wb = be.weight_bytes(llm)
            row = []
            for batch in (1, 64, 256):
                ms = be.decode_step_ms(llm, batch, context, steps=50)
                roof = (wb + batch * (context + 20) * kv_per_token) / (bw * 1e9) * 1e3
                row.append(f"b{batch} {ms:.3f} ms ({ms / roof:.2f}x)")
            log(f"{v:<10} " + "  ".join(row))
        finally:
            llm.close()


VARIANT = "off"

if __name__ == "__main__":
    main(sys.argv[1:])
