"""The token counts a step with prefills runs at on a GPU (pure Python: the planner's simulator pads as the engine
does)."""
from __future__ import annotations


def padded_tokens(n: int, budget: int) -> int:
    """The token count a step with prefills runs at on a GPU: one of a few dozen sizes (multiples of 64 to 512, of
    256 to 4096, of 1024 beyond; never past `budget`, the step's token budget, unless `n` is), because cuBLAS
    chooses each GEMM shape's algorithm the first time it meets it, and a prompt's length would otherwise make a
    new shape for nearly every request. Warm-up runs each size once (`token_buckets`)."""
    for limit, unit in ((512, 64), (4096, 256), (1 << 62, 1024)):
        if n <= limit:
            return max(n, min(-(-n // unit) * unit, budget))
    return n


def token_buckets(budget: int) -> list[int]:
    """Every token count `padded_tokens` gives for steps of up to `budget` tokens."""
    return sorted({padded_tokens(n, budget) for n in range(1, budget + 1)})
