"""The Triton kernels of the layers' CUDA paths (fused.py, gemv.py, splitk.py), imported the first time a CUDA tensor
asks for them: an engine on CPU never imports triton, even where it is installed."""
from __future__ import annotations

import importlib
from types import ModuleType

import torch

_loaded: dict[str, ModuleType | None] = {}


def _triton_module(name: str) -> ModuleType | None:
    """`common.engine.layers.<name>`, or None where triton cannot be imported (then the torch paths serve)."""
    if name not in _loaded:
        try:
            _loaded[name] = importlib.import_module(f"common.engine.layers.{name}")
        except ImportError:
            _loaded[name] = None
    return _loaded[name]


def fused_kernels() -> ModuleType | None:
    """common.engine.layers.fused: the elementwise fusions."""
    return _triton_module("fused")


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.gemv where it serves `F.linear(x, weight)` (a few rows of x on CUDA), else None."""
    if not x.is_cuda or (gemv := _triton_module("gemv")) is None:
        return None
    return gemv if gemv.fits(x, weight) else None


def split_k_gemm(x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.splitk where it serves `F.linear(x, weight)` (a decode batch of x on CUDA, a weight of
    few outputs), else None."""
    if not x.is_cuda or (splitk := _triton_module("splitk")) is None:
        return None
    return splitk if splitk.fits(x, weight) else None


def head_sampler(hidden: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.head_sampler where it serves the LM head and one-pass sampler of `hidden` (a decode
    batch on CUDA), else None."""
    if not hidden.is_cuda or (sampler := _triton_module("head_sampler")) is None:
        return None
    return sampler if sampler.fits(hidden, weight) else None
