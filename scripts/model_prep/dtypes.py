"""Weight dtypes without torch: their names, safetensors codes, and float32 values turned into stored bits.

numpy has no bfloat16, so a bfloat16 tensor travels as uint16 holding the top half of each float32, rounded to
nearest even as torch's ``.to(torch.bfloat16)`` rounds.
"""
from __future__ import annotations

from typing import Any

import numpy as np
_ALIASES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}
SAFETENSORS_CODE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
# The numpy dtype that holds each dtype's bytes.
STORAGE = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(np.uint16), "float16": np.dtype(np.float16)}

_BF16_NAN = np.uint16(0x7FC0)


def parse_dtype(dtype: Any, cfg: dict[str, Any]) -> str:
    """``dtype`` (a name, an alias, or a torch dtype), else the config's own torch_dtype; one of the engine's dtypes
    (common.protocol.kv.DTYPES)."""
    if dtype is None:
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _ALIASES:
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    return _ALIASES[key]


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounded to nearest, ties to even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits >> 16
    rounded &= 1
    rounded += 0x7FFF
    rounded += bits  # cannot wrap: only NaNs lie above 0xFF800000, and they are replaced below
    rounded >>= 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = _BF16_NAN
    return out


def encode(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as ``dtype``'s stored array (see STORAGE)."""
    if dtype == "bfloat16":
        return bfloat16_bits(x)
    with np.errstate(over="ignore"):  # beyond float16's range is inf, as in torch
        return x.astype(STORAGE[dtype], copy=False)
