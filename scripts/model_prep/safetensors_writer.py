"""Streaming safetensors writer: tensors arrive in chunks (numpy arrays) and go to disk one chunk at a time, so
memory stays bounded whatever the checkpoint's size."""
from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.protocol.kv import DTYPE_BYTES
from scripts.model_prep.dtypes import SAFETENSORS_CODE, STORAGE
from scripts.model_prep.staging import write_json

SHARD_BYTES = 4 * 10**9

# (tensor name, chunk): every tensor's chunks in the order of its specs, each chunk a run of leading rows in
# the dtype's STORAGE array type.
Chunks = Iterable[tuple[str, np.ndarray]]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # one of common.protocol.kv.DTYPES

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def _header(specs: Sequence[TensorSpec]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": SAFETENSORS_CODE[s.dtype], "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned


def write_safetensors(path: Path, specs: Sequence[TensorSpec], chunks: Iterator[tuple[str, np.ndarray]],
                      progress: Any = None) -> None:
    """Write a .safetensors file holding ``specs`` in order, taking their chunks from ``chunks``."""
    header = _header(specs)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for spec in specs:
            written = 0
            while written < spec.nbytes:
                name, chunk = next(chunks, (None, None))
                if name != spec.name:
                    raise ValueError(f"{spec.name}: got a chunk of {name or 'nothing'} after {written} bytes")
                if chunk.dtype != STORAGE[spec.dtype]:
                    raise TypeError(f"{spec.name}: got {chunk.dtype}, expected {STORAGE[spec.dtype]} ({spec.dtype})")
                data = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
                f.write(data.data)
                written += data.nbytes
                if progress is not None:
                    progress.update(data.nbytes)
            if written != spec.nbytes:
                raise ValueError(f"{spec.name}: wrote {written} bytes, expected {spec.nbytes}")


def plan_shards(specs: Sequence[TensorSpec], max_bytes: int = SHARD_BYTES) -> list[list[TensorSpec]]:
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def write_checkpoint(out: Path, specs: Sequence[TensorSpec], chunks: Chunks, desc: str,
                     max_shard_bytes: int = SHARD_BYTES) -> None:
    """``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``."""
    from tqdm import tqdm

    shards = plan_shards(specs, max_shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(s.nbytes for s in specs)
    stream = iter(chunks)
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, mininterval=1.0) as bar:
        for name, shard in zip(names, shards):
            write_safetensors(out / name, shard, stream, bar)
    if next(stream, None) is not None:
        raise ValueError("more chunks than the tensors hold")
    if n > 1:
        weight_map = {s.name: name for name, shard in zip(names, shards) for s in shard}
        write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
