"""Random weights without torch: tensor names and shapes from the config (checked against transformers' own
model), bf16 rounding (checked against torch's), values that depend on nothing but seed, name and shape, and
bounded memory while writing."""
from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from scripts.model_prep import BUILTIN_CONFIGS, random_weights, resolve_config
from scripts.model_prep.architecture import param_specs
from common.protocol.kv import DTYPES
from scripts.model_prep.dtypes import STORAGE, bfloat16_bits, encode, parse_dtype
from scripts.model_prep.safetensors_writer import TensorSpec, write_checkpoint


def hf_meta_tensors(cfg: dict, tmp_path: Path) -> list[tuple[str, tuple[int, ...]]]:
    """What save_pretrained would write: parameters (a tied lm_head is the embedding's) and persistent buffers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    tensors = dict(model.named_parameters())
    persistent = model.state_dict().keys()
    tensors.update((n, b) for n, b in model.named_buffers() if n in persistent)
    return [(n, tuple(t.shape)) for n, t in tensors.items()]


def variant(base: str, **changes) -> dict:
    cfg = {**resolve_config(base)[1], **changes}
    return {k: v for k, v in cfg.items() if v is not ...}


VARIANTS = {
    **{name: resolve_config(name)[1] for name in BUILTIN_CONFIGS},
    "qwen2 (qkv bias)": variant("tiny-qwen3", model_type="qwen2", architectures=["Qwen2ForCausalLM"], head_dim=...),
    "qwen3 attention_bias": variant("tiny-qwen3", attention_bias=True, tie_word_embeddings=False),
    "qwen3 defaults": variant("tiny-qwen3", head_dim=..., num_key_value_heads=..., tie_word_embeddings=...),
    "mistral": variant("tiny-llama", model_type="mistral", architectures=["MistralForCausalLM"], rope_scaling=None,
                       num_key_value_heads=...),
    "llama biases, tied": variant("tiny-llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    "llama defaults": variant("tiny-llama", head_dim=..., num_key_value_heads=None),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_tensor_names_and_shapes_are_transformers(name: str, tmp_path: Path) -> None:
    cfg = VARIANTS[name]
    ours = [(s.name, s.shape) for s in param_specs(cfg, "bfloat16")]
    assert ours == hf_meta_tensors(cfg, tmp_path)


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                    np.finfo(np.float32).tiny, np.finfo(np.float32).smallest_subnormal, 1e-40, -3e-39, 65504.0],
                   dtype=np.float32)


def test_every_engine_dtype_can_be_written_and_no_other() -> None:
    for name in DTYPES:
        assert parse_dtype(name, {}) == name and name in STORAGE
        assert parse_dtype(None, {"torch_dtype": name}) == name
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        parse_dtype("int8", {})


def test_bfloat16_rounding_matches_torch() -> None:
    rng = np.random.default_rng(0)
    halfway = (rng.integers(0, 1 << 31, 4096, dtype=np.uint32) & 0xFFFF0000) | 0x8000  # exact ties, both parities
    near = halfway + rng.integers(-2, 3, 4096).astype(np.uint32)
    x = np.concatenate([SPECIAL, rng.standard_normal(1 << 16, dtype=np.float32) * 0.02,
                        rng.standard_normal(1 << 12, dtype=np.float32) * 1e30, halfway.view(np.float32),
                        near.view(np.float32), np.array([np.nan, -np.nan], np.float32)])
    finite_or_inf = ~np.isnan(x)
    ours = bfloat16_bits(x)
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours[finite_or_inf], theirs[finite_or_inf])
    back = (ours.astype(np.uint32) << 16).view(np.float32)
    assert np.isnan(back[~finite_or_inf]).all()
    assert encode(x, "bfloat16").dtype == np.uint16 and encode(x, "float32") is x


def test_float16_matches_torch() -> None:
    x = np.concatenate([SPECIAL, np.random.default_rng(1).standard_normal(4096, dtype=np.float32) * 100])
    np.testing.assert_array_equal(encode(x, "float16"), torch.from_numpy(x).to(torch.float16).numpy())


def chunks_of(specs, workers: int) -> dict[str, np.ndarray]:
    out: dict[str, list[np.ndarray]] = {}
    cfg, overrides = {"initializer_range": 0.5}, {"embed_std": 3.0}
    for name, chunk in random_weights.random_tensors(specs, cfg, 7, overrides, workers):
        out.setdefault(name, []).append(chunk)
    return {name: np.concatenate(parts) for name, parts in out.items()}


def test_values_depend_on_seed_name_and_shape_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random_weights, "BLOCK_ELEMS", 1000)  # many blocks a matrix
    specs = [TensorSpec("a.weight", (300, 64), "float32"), TensorSpec("a.norm.weight", (64,), "float32"),
             TensorSpec("b.bias", (5,), "bfloat16"), TensorSpec("b.weight", (7, 3000), "bfloat16"),
             TensorSpec("model.embed_tokens.weight", (200, 50), "float32")]
    one, three = chunks_of(specs, 1), chunks_of(specs, 3)
    assert all(np.array_equal(one[k], three[k]) for k in one) and list(one) == [s.name for s in specs]
    alone = chunks_of(specs[:1], 2)["a.weight"]  # the neighbours and their order do not matter
    np.testing.assert_array_equal(alone, one["a.weight"])
    a = one["a.weight"]
    assert a.shape == (300, 64) and abs(a.std() - 0.5) < 0.01 and abs(a.mean()) < 0.01
    assert abs(one["model.embed_tokens.weight"].std() - 3.0) < 0.05  # each tensor its own std
    assert not np.array_equal(a[:15], a[15:30])  # blocks get their own streams
    assert (one["a.norm.weight"] == 1).all() and (one["b.bias"] == 0).all()
    assert one["b.weight"].dtype == np.uint16 and one["b.weight"].shape == (7, 3000)


def test_writing_keeps_memory_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random_weights, "BLOCK_ELEMS", 1 << 18)  # 1 MiB of float32 a block
    specs = [TensorSpec("big.weight", (4096, 4096), "float32"), TensorSpec("norm.weight", (4096,), "float32")]
    tracemalloc.start()
    try:
        write_checkpoint(tmp_path, specs, random_weights.random_tensors(specs, {}, 0, {}, workers=2), desc="test")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (tmp_path / "model.safetensors").stat().st_size > 64 << 20
    assert peak < 16 << 20, f"peak {peak / 2**20:.1f} MiB while writing a 64 MiB tensor"
    loaded = load_file(str(tmp_path / "model.safetensors"))
    assert loaded["big.weight"].shape == (4096, 4096) and abs(float(loaded["big.weight"].std()) - 0.02) < 1e-3


def test_written_checkpoint_reads_back_in_torch(tmp_path: Path) -> None:
    out = random_weights.prepare_random("tiny-llama", tmp_path / "m", dtype="bf16", seed=5)
    from safetensors.torch import load_file as load_torch

    tensors = load_torch(str(out / "model.safetensors"))
    spec = {s.name: s for s in param_specs(resolve_config("tiny-llama")[1], "bfloat16")}
    assert tensors.keys() == spec.keys()
    assert all(t.dtype == torch.bfloat16 and tuple(t.shape) == spec[k].shape for k, t in tensors.items())
    info = json.loads((out / "pdcluster_prep.json").read_text())
    assert info["dtype"] == "bfloat16" and info["seed"] == 5 and "device" not in info
