"""The Triton fusions (fused.py) for the layers' CUDA paths, imported the first time a CUDA tensor asks for
them: an engine on CPU never imports triton, even where it is installed."""
from __future__ import annotations

from types import ModuleType

_NOT_LOADED = object()
_fused: ModuleType | None | object = _NOT_LOADED


def fused_kernels() -> ModuleType | None:
    """`common.engine.layers.fused`, or None where triton cannot be imported (then the torch paths serve)."""
    global _fused
    if _fused is _NOT_LOADED:
        try:
            from common.engine.layers import fused
        except ImportError:
            fused = None
        _fused = fused
    return _fused
