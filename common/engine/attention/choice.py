"""Which attention backend an engine runs (`--attention-backend`), and making it with its kernels."""
from __future__ import annotations

import importlib.util
import logging

import torch

from common.engine.attention.backend import AttentionBackend, AttentionOps
from common.engine.attention.torch_backend import TorchBackend
from common.engine.attention.triton_backend import FlashAttnBackend, TritonBackend

log = logging.getLogger(__name__)

BACKENDS = ("torch", "triton", "flash_attn")


def resolve_backend(name: str, device: str) -> str:
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
    return name


def create_backend(name: str, device: torch.device, num_kv_heads: int) -> AttentionBackend:
    """The backend for a model of `num_kv_heads` KV heads (per rank) on `device`. Only the GPU backends import
    their kernels, and with them triton."""
    name = resolve_backend(name, device.type)
    if name == "torch":
        backend = TorchBackend()
    elif name == "triton":
        from common.engine.attention import triton_ops
        from common.engine.attention.flash_prefill import varlen_prefill

        ops = AttentionOps(triton_ops.store_kvcache, triton_ops.paged_decode_attention, varlen_prefill,
                           triton_ops.paged_prefill_attention)
        backend = TritonBackend(ops, num_kv_heads, device)
    else:
        from common.engine.attention import flash_attn_ops, triton_ops

        ops = AttentionOps(triton_ops.store_kvcache, flash_attn_ops.paged_decode_attention,
                           flash_attn_ops.varlen_attention, flash_attn_ops.paged_prefill_attention)
        backend = FlashAttnBackend(ops, num_kv_heads, device)
    log.info("attention backend: %s", backend.name)
    return backend
