"""Whole KV blocks copied by id in one kernel: `dst[dst_ids[i]] = src[src_ids[i]]` for block-major pools.

The pools may sit on two GPUs of a node: the kernel runs on the destination's GPU and reads the source
pool over the link (peer access on). It runs there because a pool mapped by CUDA IPC can be reached only
from the GPU it is mapped on (a kernel on the source GPU storing into it faulted on 2xH200). Scattered
ids then cost one launch, where copy engines need one copy per run of consecutive ids (~26 us for a
2.4 MB block across two H200s) and a gather, a copy and a scatter move every byte three times.
"""
from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

WORDS_PER_PROGRAM = 4096  # 32 KiB of int64 words: enough per program to keep 16-byte accesses in flight


# The ids may start anywhere in a pinned buffer: no variant per alignment, so the one compiled when a pair of
# pools is first seen serves every handoff.
@triton.jit(do_not_specialize_on_alignment=["src_ids_ptr", "dst_ids_ptr"])
def _copy_blocks_kernel(src_ptr, dst_addr, src_ids_ptr, dst_ids_ptr, block_words, BLOCK: tl.constexpr):
    """Grid (pairs, parts of a block): one program copies BLOCK words of one block. The destination comes as
    an address on a GPU: Triton's launcher refuses an IPC-mapped pointer (kernels reach it all the same). In
    Triton's interpreter (CPU tests) it is the tensor, as the interpreter of some numpy versions cannot load
    through an address cast to a pointer."""
    dst_ptr = dst_addr.to(src_ptr.dtype, bitcast=True)
    pair = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < block_words
    src_block = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + pair).to(tl.int64)
    words = tl.load(src_ptr + src_block * block_words + offs, mask=mask)
    tl.store(dst_ptr + dst_block * block_words + offs, words, mask=mask)


def _words(kv: torch.Tensor) -> torch.Tensor:
    """A pool's memory as one flat tensor of the widest word its blocks divide into."""
    flat = kv.reshape(-1).view(torch.uint8)
    for dtype in (torch.int64, torch.int32, torch.int16):
        if flat.numel() % dtype.itemsize == 0 and (kv[0].numel() * kv.element_size()) % dtype.itemsize == 0:
            return flat.view(dtype)
    return flat


class BlockCopy:
    """Copies blocks by id from one pool into another, one kernel launch a call. Built once for a pair of pools
    (contiguous, block-major, equal block shapes and dtypes): it checks them and keeps their flat views, since
    host time is part of every handoff (a launch through `copy_blocks` took ~70 us on the GPU host's H100, ~20
    us of it these views)."""

    def __init__(self, src_kv: torch.Tensor, dst_kv: torch.Tensor):
        if src_kv.shape[1:] != dst_kv.shape[1:] or src_kv.dtype != dst_kv.dtype:
            raise ValueError(f"blocks differ: {tuple(src_kv.shape[1:])} {src_kv.dtype} vs "
                             f"{tuple(dst_kv.shape[1:])} {dst_kv.dtype}")
        if not (src_kv.is_contiguous() and dst_kv.is_contiguous()):
            raise ValueError("copy_blocks needs contiguous pools")
        self.device = dst_kv.device
        self.src, dst = _words(src_kv), _words(dst_kv)
        self.dst = dst.data_ptr() if dst.is_cuda else dst
        self.block_words = self.src.numel() // src_kv.shape[0]
        self.parts = triton.cdiv(self.block_words, WORDS_PER_PROGRAM)
        if self.device.type == "cuda":  # compiled (or loaded) now, when the peer is first seen, not in a handoff
            ids = torch.zeros(1, dtype=torch.int64, device=self.device)
            with torch.cuda.device(self.device):
                _copy_blocks_kernel.warmup(self.src, self.dst, ids, ids, self.block_words, BLOCK=WORDS_PER_PROGRAM,
                                           num_warps=4, grid=(1, self.parts))

    def __call__(self, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        """Blocks `src_ids` -> blocks `dst_ids` on the current stream of the destination's device. The ids (int32
        or int64, equal lengths) are on that device or in pinned host memory, which the kernel reads in place
        (no upload to queue: 22 us or more of host time a handoff on the GPU host's H100)."""
        if src_ids.shape != dst_ids.shape:
            raise ValueError("copy_blocks needs equally many source and destination ids")
        n = src_ids.numel()
        if n == 0:
            return
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            _copy_blocks_kernel[(n, self.parts)](self.src, self.dst, src_ids, dst_ids, self.block_words,
                                                 BLOCK=WORDS_PER_PROGRAM, num_warps=4)


def copy_blocks(src_kv: torch.Tensor, dst_kv: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
    """Copy blocks `src_ids` of `src_kv` into blocks `dst_ids` of `dst_kv` (see BlockCopy), once."""
    BlockCopy(src_kv, dst_kv)(src_ids, dst_ids)
