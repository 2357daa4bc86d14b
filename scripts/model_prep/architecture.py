"""The tensors of a Llama-family checkpoint (Llama, Mistral, Qwen2, Qwen3), named, shaped and ordered as
transformers saves them, read off the config alone (no model is built).

The families differ in biases (Llama: ``attention_bias`` and ``mlp_bias``; Qwen2: always on q/k/v; Qwen3:
``attention_bias``), Qwen3's per-head q/k norms, and the defaults transformers gives a key the config leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scripts.model_prep.safetensors_writer import TensorSpec


@dataclass(frozen=True)
class Family:
    qkv_bias: bool | None  # None: the config's attention_bias (which also puts a bias on o_proj)
    mlp_bias: bool | None  # None: the config's mlp_bias
    qk_norm: bool
    default_kv_heads: int | None  # when the key is absent (None: as many as the attention heads)
    default_head_dim: int | None  # when the key is absent or null (None: hidden_size / heads)


FAMILIES = {
    "llama": Family(qkv_bias=None, mlp_bias=None, qk_norm=False, default_kv_heads=None, default_head_dim=None),
    "mistral": Family(qkv_bias=False, mlp_bias=False, qk_norm=False, default_kv_heads=8, default_head_dim=None),
    "qwen2": Family(qkv_bias=True, mlp_bias=False, qk_norm=False, default_kv_heads=32, default_head_dim=None),
    "qwen3": Family(qkv_bias=None, mlp_bias=False, qk_norm=True, default_kv_heads=32, default_head_dim=128),
}
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def family(cfg: dict[str, Any]) -> Family:
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(f"random weights: model_type {model_type!r} is not supported "
                         f"(supported: {', '.join(FAMILIES)})")
    return FAMILIES[model_type]


def param_specs(cfg: dict[str, Any], dtype: str) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in transformers' order; a tied lm_head is not one (it is the embedding)."""
    fam = family(cfg)
    missing = [k for k in _REQUIRED if not isinstance(cfg.get(k), int)]
    if missing:
        raise ValueError(f"random weights: the model config has no integer {', '.join(map(repr, missing))}")
    vocab, hidden, inter = cfg["vocab_size"], cfg["hidden_size"], cfg["intermediate_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", fam.default_kv_heads) or heads
    head_dim = cfg.get("head_dim") or fam.default_head_dim or hidden // heads
    attention_bias = bool(cfg.get("attention_bias", False))
    qkv_bias = attention_bias if fam.qkv_bias is None else fam.qkv_bias
    o_bias = attention_bias if fam.qkv_bias is None else False
    mlp_bias = bool(cfg.get("mlp_bias", False)) if fam.mlp_bias is None else fam.mlp_bias

    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]

    def linear(name: str, n_in: int, n_out: int, bias: bool) -> None:
        shapes.append((f"{name}.weight", (n_out, n_in)))
        if bias:
            shapes.append((f"{name}.bias", (n_out,)))

    for i in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        linear(f"{layer}.self_attn.q_proj", hidden, heads * head_dim, qkv_bias)
        linear(f"{layer}.self_attn.k_proj", hidden, kv_heads * head_dim, qkv_bias)
        linear(f"{layer}.self_attn.v_proj", hidden, kv_heads * head_dim, qkv_bias)
        linear(f"{layer}.self_attn.o_proj", heads * head_dim, hidden, o_bias)
        if fam.qk_norm:
            shapes.append((f"{layer}.self_attn.q_norm.weight", (head_dim,)))
            shapes.append((f"{layer}.self_attn.k_norm.weight", (head_dim,)))
        linear(f"{layer}.mlp.gate_proj", hidden, inter, mlp_bias)
        linear(f"{layer}.mlp.up_proj", hidden, inter, mlp_bias)
        linear(f"{layer}.mlp.down_proj", inter, hidden, mlp_bias)
        shapes.append((f"{layer}.input_layernorm.weight", (hidden,)))
        shapes.append((f"{layer}.post_attention_layernorm.weight", (hidden,)))
    shapes.append(("model.norm.weight", (hidden,)))
    if not cfg.get("tie_word_embeddings", False):
        shapes.append(("lm_head.weight", (vocab, hidden)))
    return [TensorSpec(name, shape, dtype) for name, shape in shapes]
