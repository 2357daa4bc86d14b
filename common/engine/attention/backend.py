from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Callable

import torch

from common.engine.attention import torch_ops
from common.engine.attention.metadata import AttentionMetadata

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionBackend:
    """Four ops make a backend; `forward` routes a step's decodes and prefills to them (docs/design.md)."""

    name: str
    store_kvcache: Callable
    decode: Callable  # paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, plan=None)
    prefill: Callable  # varlen_attention(q, k, v, cu_seqlens, max_len, scale): fresh prompts, no cache read
    prefill_paged: Callable  # paged_prefill_attention(q, k_cache, v_cache, qsl, seq_lens, block_tables, max_q, scale)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor | None,
                v_cache: torch.Tensor | None, md: AttentionMetadata, scale: float,
                kv_stored: bool = False) -> torch.Tensor:
        """`kv_stored`: k and v are in the cache already (written by the fused rope kernel)."""
        if k_cache is not None and not kv_stored:
            self.store_kvcache(k, v, k_cache, v_cache, md.slot_mapping)
        nd = md.num_decodes
        if md.num_prefills == 0:
            return self.decode(q, k_cache, v_cache, md.block_tables, md.seq_lens, scale, plan=md.decode_plan)
        out = torch.empty_like(q) if nd else None
        if md.prefix_cached:
            pre = self.prefill_paged(q[nd:], k_cache, v_cache, md.prefill_query_start_loc, md.seq_lens[nd:],
                                     md.block_tables[nd:], md.max_prefill_query_len, scale)
        else:
            pre = self.prefill(q[nd:], k[nd:], v[nd:], md.prefill_query_start_loc, md.max_prefill_query_len, scale)
        if out is None:
            return pre
        out[nd:] = pre
        out[:nd] = self.decode(q[:nd], k_cache, v_cache, md.block_tables[:nd], md.seq_lens[:nd], scale,
                               plan=md.decode_plan)
        return out


def _torch_varlen(q, k, v, cu_seqlens, max_len, scale):
    return torch_ops.varlen_attention(q, k, v, cu_seqlens, scale)


TORCH = AttentionBackend("torch", torch_ops.store_kvcache, torch_ops.paged_decode_attention, _torch_varlen,
                         torch_ops.paged_prefill_attention)


def _triton_backend() -> AttentionBackend:
    from common.engine.attention import triton_ops
    from common.engine.attention.flash_prefill import varlen_prefill

    return AttentionBackend("triton", triton_ops.store_kvcache, triton_ops.paged_decode_attention, varlen_prefill,
                            triton_ops.paged_prefill_attention)


def _flash_attn_backend() -> AttentionBackend:
    from common.engine.attention import flash_attn_ops, triton_ops

    return AttentionBackend("flash_attn", triton_ops.store_kvcache, flash_attn_ops.paged_decode_attention,
                            flash_attn_ops.varlen_attention, flash_attn_ops.paged_prefill_attention)


BACKENDS: dict[str, Callable[[], AttentionBackend]] = {
    "torch": lambda: TORCH,
    "triton": _triton_backend,
    "flash_attn": _flash_attn_backend,
}


def select_backend(name: str, device: str) -> AttentionBackend:
    """`auto`: flash_attn when importable on CUDA, else triton on CUDA, else torch."""
    if name == "auto":
        if device != "cuda":
            name = "torch"
        elif importlib.util.find_spec("flash_attn") is not None:
            name = "flash_attn"
        else:
            name = "triton"
    if name not in BACKENDS:
        raise ValueError(f"attention_backend: must be auto or one of {', '.join(BACKENDS)}, got {name!r}")
    if name != "torch" and device != "cuda":
        raise ValueError(f"attention_backend: {name} needs device cuda")
    backend = BACKENDS[name]()
    log.info("attention backend: %s", backend.name)
    return backend
