"""Seeded random-weight checkpoints of a built-in or given config, made with numpy (no torch), streamed to disk.

Matrices are Normal(0, std), norm weights ones, other vectors (biases) zeros. A matrix is generated in blocks of
leading rows (about BLOCK_ELEMS values each), each block by its own generator seeded from (seed, tensor name,
block index): the values depend on the seed, the name and the shape only, not on the shard layout or on how many
threads make them, and blocks are made in parallel, a bounded number ahead of the writer.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from scripts.model_prep.architecture import param_specs
from scripts.model_prep.dtypes import encode, parse_dtype
from scripts.model_prep.model_config import finalize_config, generation_config, resolve_config
from scripts.model_prep.safetensors_writer import SHARD_BYTES, TensorSpec, write_checkpoint
from scripts.model_prep.staging import staging_dir, write_json, write_prep_info
from scripts.model_prep.tokenizer import write_random_tokenizer

log = logging.getLogger("scripts.model_prep")

# Part of what the values are: changing it changes every checkpoint larger than one block.
BLOCK_ELEMS = 1 << 22
MAX_WORKERS = 16

# The tiny models serve greedy-decoding tests. Their configs set initializer_range ~ 1/sqrt(hidden) so that
# every layer moves the residual stream (context matters, greedy output does not just repeat the input), and
# large embedding / lm_head stds spread the logits (std ~35-40) so the top-1 logit usually clears the
# runner-up by several units. The tied tiny-qwen3 needs embeddings small relative to the layer outputs, or its
# lm_head (= embeddings) would mostly predict the current token again.
TINY_INIT: dict[str, dict[str, float]] = {
    "tiny-qwen3": {"embed_std": 3.0},
    "tiny-llama": {"embed_std": 1.0, "lm_head_std": 3.0},
}

T = TypeVar("T")


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def init_std(name: str, cfg: dict[str, Any], overrides: dict[str, float]) -> float:
    if name.endswith("embed_tokens.weight") and "embed_std" in overrides:
        return overrides["embed_std"]
    if name.endswith("lm_head.weight") and "lm_head_std" in overrides:
        return overrides["lm_head_std"]
    return float(cfg.get("initializer_range", 0.02))


def block_rows(spec: TensorSpec) -> int:
    """Leading rows per generator block of a matrix."""
    return max(1, BLOCK_ELEMS // max(1, spec.numel // spec.shape[0]))


def random_block(spec: TensorSpec, seed: int, std: float, start: int) -> np.ndarray:
    """Rows [start, start + block_rows) of a Normal(0, std) matrix, in its dtype's storage type."""
    rows = min(block_rows(spec), spec.shape[0] - start)
    stream = np.random.SeedSequence(tensor_seed(seed, spec.name), spawn_key=(start // block_rows(spec),))
    values = np.random.Generator(np.random.PCG64(stream)).standard_normal((rows, *spec.shape[1:]), np.float32)
    values *= np.float32(std)
    return encode(values, spec.dtype)


def constant(spec: TensorSpec) -> np.ndarray:
    return encode(np.full(spec.shape, 1.0 if "norm" in spec.name else 0.0, np.float32), spec.dtype)


def random_tensors(specs: Iterable[TensorSpec], cfg: dict[str, Any], seed: int, overrides: dict[str, float],
                   workers: int = 1) -> Iterator[tuple[str, np.ndarray]]:
    """Every tensor's chunks, in order, generated on ``workers`` threads."""
    jobs: list[tuple[str, Callable[[], np.ndarray]]] = []
    for spec in specs:
        if len(spec.shape) < 2:
            jobs.append((spec.name, functools.partial(constant, spec)))
            continue
        std = init_std(spec.name, cfg, overrides)
        for start in range(0, spec.shape[0], block_rows(spec)):
            jobs.append((spec.name, functools.partial(random_block, spec, seed, std, start)))
    results = in_order((job for _, job in jobs), workers)
    try:
        for (name, _), chunk in zip(jobs, results):
            yield name, chunk
    finally:
        results.close()


def in_order(jobs: Iterable[Callable[[], T]], workers: int) -> Iterator[T]:
    """The jobs' results in job order, run on ``workers`` threads at most 2 * workers ahead of the consumer.

    numpy's generators and ufuncs release the GIL, so the threads do run in parallel."""
    pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="random-weights")
    pending: deque[Future[T]] = deque()
    try:
        for job in jobs:
            pending.append(pool.submit(job))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def default_workers() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(MAX_WORKERS, cpus)


def write_config_and_tokenizer(out: Path, cfg: dict[str, Any]) -> None:
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json", generation_config(cfg))
    write_random_tokenizer(out, cfg)


def prepare_random(config: str | os.PathLike[str], out: Path, seed: int = 0, dtype: Any = None, *,
                   overwrite: bool = False, max_shard_bytes: int = SHARD_BYTES, workers: int | None = None) -> Path:
    """Write a random-weight checkpoint of ``config`` (a built-in name or a config.json path) to ``out``, with a
    byte-level BPE tokenizer whose vocabulary covers every id the model can emit. Returns the absolute path.

    Peak memory is bounded by the generating threads (under 100 MB each, default one a core up to
    MAX_WORKERS), not by the model's size.
    """
    name, raw = resolve_config(config)
    dtype = parse_dtype(dtype, raw)
    cfg = finalize_config(raw, dtype)
    specs = param_specs(cfg, dtype)
    out = Path(out).expanduser().absolute()
    log.info("preparing random %s (%s, seed %d) in %s", name, dtype, seed, out)
    with staging_dir(out, overwrite) as tmp:
        write_config_and_tokenizer(tmp, cfg)
        chunks = random_tensors(specs, cfg, seed, TINY_INIT.get(name, {}), workers or default_workers())
        write_checkpoint(tmp, specs, chunks, desc=f"random {Path(name).name}", max_shard_bytes=max_shard_bytes)
        write_prep_info(tmp, source=f"random:{name}", seed=seed, dtype=dtype, rng="numpy-pcg64-blocks")
    log.info("wrote %s", out)
    return out


def prepare_tokenizer(config: str | os.PathLike[str], out: Path, *, overwrite: bool = False) -> Path:
    """Only the config.json, generation_config.json and tokenizer files that ``prepare_random`` writes."""
    name, raw = resolve_config(config)
    cfg = finalize_config(raw, parse_dtype(None, raw))
    out = Path(out).expanduser().absolute()
    with staging_dir(out, overwrite) as tmp:
        write_config_and_tokenizer(tmp, cfg)
        write_prep_info(tmp, source=f"tokenizer:{name}")
    return out
