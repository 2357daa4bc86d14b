"""Loads HF safetensors checkpoints into the engine's (packed, sharded) parameters."""
from __future__ import annotations

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm

from common.config import weight_files


def load_weights(model: nn.Module, path: str, show_progress: bool = True) -> None:
    files = [str(f) for f in weight_files(path)]
    params = dict(model.named_parameters(remove_duplicate=False))
    packed = getattr(model, "packed_modules", {})
    tied = getattr(model.config, "tie_word_embeddings", False)
    loaded: set[str] = set()
    for file in tqdm(files, desc="Loading weights", disable=not show_progress or len(files) < 2):
        with safe_open(file, "pt", "cpu") as f:
            for name in f.keys():
                if tied and name == "lm_head.weight" or "rotary_emb.inv_freq" in name:
                    continue
                target, shard = _target(name, packed)
                if target not in params:
                    raise KeyError(f"checkpoint tensor {name!r} has no place in {type(model).__name__}")
                param = params[target]
                loader = getattr(param, "weight_loader", None)
                tensor = f.get_tensor(name).to(param.dtype)
                if shard is not None:
                    loader(param, tensor, shard)
                elif loader is not None:
                    loader(param, tensor)
                else:
                    param.data.copy_(tensor)
                loaded.add(target)
    missing = {n for n in params if n not in loaded and not (tied and n == "lm_head.weight")}
    if missing:
        raise KeyError(f"checkpoint {path!r} lacks {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def _target(name: str, packed: dict[str, tuple[str, object]]) -> tuple[str, object]:
    for piece, (packed_name, shard) in packed.items():
        if f".{piece}." in name:
            return name.replace(f".{piece}.", f".{packed_name}."), shard
    return name, None


def init_dummy_weights(model: nn.Module, seed: int = 0, std: float = 0.02) -> None:
    """Random weights for benchmarks: speed depends on shapes, not values."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
        else:
            param.data.normal_(0.0, std, generator=gen)
