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


def _serving(name: str, x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """`common.engine.layers.<name>` where its `fits(x, weight)` says it serves x (on CUDA), else None."""
    if not x.is_cuda or (module := _triton_module(name)) is None:
        return None
    return module if module.fits(x, weight) else None


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.gemv where it serves `F.linear(x, weight)` (a few rows of x on CUDA), else None."""
    return _serving("gemv", x, weight)


def split_k_gemm(x: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.splitk where it serves `F.linear(x, weight)` (a decode batch of x on CUDA, a weight of
    few outputs), else None."""
    return _serving("splitk", x, weight)


def head_sampler(hidden: torch.Tensor, weight: torch.Tensor) -> ModuleType | None:
    """common.engine.layers.head_sampler where it serves the LM head and one-pass sampler of `hidden` (a decode
    batch on CUDA), else None."""
    return _serving("head_sampler", hidden, weight)
