"""Model configs: the built-in ones (configs/*.json) or a user's config.json, and the config.json a prepared
checkpoint carries."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from scripts.model_prep.tokenizer import special_token_ids

CONFIG_DIR = Path(__file__).with_name("configs")
BUILTIN_CONFIGS = ("tiny-qwen3", "tiny-llama", "smollm2-135m", "qwen3-0.6b", "qwen3-8b")


def resolve_config(config: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """(name, config dict) for a built-in name or a path to a config.json (or to a folder holding one)."""
    name = str(config)
    if name in BUILTIN_CONFIGS:
        return name, json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))
    path = Path(name).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"unknown model config {name!r}: expected one of {', '.join(BUILTIN_CONFIGS)} or a path to a config.json")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"model config {path} is not valid JSON: {e}") from e
    if not isinstance(cfg, dict):
        raise ValueError(f"model config {path} is not a JSON object")
    for key in ("model_type", "vocab_size", "hidden_size"):
        if key not in cfg:
            raise ValueError(f"model config {path} has no {key!r}")
    return str(path), cfg


def finalize_config(cfg: dict[str, Any], dtype: str) -> dict[str, Any]:
    """The config.json to write: token ids agree with the tokenizer, dtype under both spellings (4.x and 5.x)."""
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "quantization_config"}
    ids = special_token_ids(cfg)
    cfg.update(bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"])
    cfg["torch_dtype"] = cfg["dtype"] = dtype
    return dict(sorted(cfg.items()))


def generation_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
