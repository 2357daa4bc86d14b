"""Which Triton kernel variants a stretch of code made ready: each one Triton had to compile, or load from its
on-disk cache, because no variant in memory matched the launch. After warm-up a serving engine should see none.

    with CompileWatch() as watch:
        engine.step()
    watch.variants  # ["_decode_kernel[num_warps=4, ...](q_ptr: *bf16, ...)", ...]
"""
from __future__ import annotations

import importlib.util
from typing import Any


class CompileWatch:
    """Records Triton's JIT cache misses between enter and exit (its `jit_cache_hook`, chained to any hook set
    before). Records nothing where triton is not installed."""

    def __init__(self) -> None:
        self.variants: list[str] = []
        self._knobs: Any = None
        self._previous: Any = None

    def __enter__(self) -> CompileWatch:
        if importlib.util.find_spec("triton") is None:
            return self
        import triton

        self._knobs = triton.knobs.runtime
        self._previous = self._knobs.jit_cache_hook
        self._knobs.jit_cache_hook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        if self._knobs is not None:
            self._knobs.jit_cache_hook = self._previous
            self._knobs = None

    def _hook(self, *args: Any, **kwargs: Any) -> bool | None:
        self.variants.append(_describe(kwargs))
        if self._previous is not None:
            return self._previous(*args, **kwargs)
        return None  # compile as usual

    def __len__(self) -> int:
        return len(self.variants)


def _describe(hook_kwargs: dict[str, Any]) -> str:
    """The kernel's name, argument types and what it was specialized on (alignment, ints equal to 1)."""
    compile_info = hook_kwargs.get("compile") or {}
    fn = hook_kwargs.get("fn")
    name = getattr(fn, "name", None) or str(hook_kwargs.get("repr", "?")).split("[")[0]
    signature = compile_info.get("signature") or {}
    types = ", ".join(f"{arg}: {kind}" for arg, kind in signature.items() if kind != "constexpr")
    configs = compile_info.get("configs") or [{}]
    return f"{name}({types}) specialized {configs[0]}"
