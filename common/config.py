"""What the engine is told: `EngineConfig` (one dataclass, filled from CLI flags) and the parts of a checkpoint's
config.json it needs (`ModelConfig`). Plain data, no tensors: the router and the launcher read it too."""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from common.protocol.kv import DTYPES
DEVICES = ("cpu", "cuda")
STEP_TOKENS = {"cuda": 8192, "cpu": 512}  # max_num_batched_tokens unless given
LOAD_FORMATS = ("auto", "dummy")

# architecture -> (attention has qkv bias, per-head q/k RMSNorm)
ARCHITECTURES = {
    "LlamaForCausalLM": (False, False),
    "MistralForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
}


class ConfigError(ValueError):
    pass


@dataclass
class ModelConfig:
    """The parts of an HF config.json the engine needs."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    dtype: str  # the checkpoint's: one of DTYPES
    eos_token_ids: list[int]
    bos_token_id: int | None

    @classmethod
    def from_dir(cls, model: str | os.PathLike) -> ModelConfig:
        path = Path(model) / "config.json"
        if not path.is_file():
            raise ConfigError(f"model: no config.json in {model!r} (is it an HF checkpoint folder?)")
        return cls.from_dict(json.loads(path.read_text()))

    @classmethod
    def from_dict(cls, c: dict) -> ModelConfig:
        arch = (c.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise ConfigError(f"model: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES)})")
        qkv_bias, qk_norm = ARCHITECTURES[arch]
        rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
        rope_theta = float(c.get("rope_theta") or rope.pop("rope_theta", 10000.0))
        rope.pop("rope_theta", None)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        eos = c.get("eos_token_id")
        dtype = c.get("torch_dtype") or c.get("dtype") or "float32"
        return cls(
            architecture=arch,
            vocab_size=c["vocab_size"],
            hidden_size=c["hidden_size"],
            intermediate_size=c["intermediate_size"],
            num_layers=c["num_hidden_layers"],
            num_heads=c["num_attention_heads"],
            num_kv_heads=c.get("num_key_value_heads") or c["num_attention_heads"],
            head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=None if rope_type == "default" else rope,
            max_position_embeddings=c.get("max_position_embeddings", 4096),
            tie_word_embeddings=c.get("tie_word_embeddings", False),
            qkv_bias=c.get("attention_bias", qkv_bias),
            qk_norm=qk_norm,
            dtype=_dtype_name(dtype),
            eos_token_ids=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            bos_token_id=c.get("bos_token_id"),
        )


def _dtype_name(dtype: object) -> str:
    name = str(dtype).removeprefix("torch.")
    return name if name in DTYPES else "float32"


def parse_bytes(text: str | int) -> int:
    """'4GiB', '512MB', '1e9' or an int -> bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([KMGT]?)(i?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"not a size: {text!r} (e.g. 2GiB, 512MB)")
    base = 1024 if m.group(3) or not m.group(2) else 1000
    return int(float(m.group(1)) * base ** " KMGT".index(m.group(2).upper() or " "))


def format_bytes(n: int) -> str:
    """2147483648 -> '2GiB' (parse_bytes reads it back); sizes that are no whole unit stay in bytes."""
    for unit, power in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << power and n % (1 << power) == 0:
            return f"{n >> power}{unit}"
    return str(n)


def weight_files(model: str | Path) -> list[Path]:
    """The checkpoint's safetensors files, in load order; ConfigError when there are none."""
    files = sorted(Path(model).glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model: no *.safetensors files in {str(model)!r} (a random-weight folder needs "
                          "--load-format dummy)")
    return files


def _opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class EngineConfig:
    model: str = field(metadata={"help": "HF checkpoint folder (config.json, *.safetensors, tokenizer)"})
    device: str = _opt("auto", "cpu, cuda, or auto (cuda when available)")
    dtype: str = _opt("auto", "float32, bfloat16, float16, or auto (the checkpoint's on cuda, float32 on cpu)")
    block_size: int = _opt(16, "tokens per KV block")
    max_num_seqs: int = _opt(256, "most sequences in one step")
    max_num_batched_tokens: int | None = _opt(None, "token budget of one step; longer prompts are prefilled in chunks "
                                                    f"(default: {STEP_TOKENS['cuda']} on cuda, {STEP_TOKENS['cpu']} "
                                                    "on cpu, where a longer step takes seconds)")
    max_model_len: int | None = _opt(None, "longest prompt + completion (default: the model's limit)")
    kv_cache_memory: int = _opt(2 << 30, "bytes of KV cache on cpu, e.g. 2GiB or 512MB", parse=parse_bytes,
                                show=format_bytes)
    gpu_memory_utilization: float = _opt(0.9, "share of the GPU's memory this worker may use "
                                              "(weights, activations, KV)")
    num_kv_blocks: int | None = _opt(None, "fix the KV pool's block count instead of sizing it from memory")
    enable_prefix_caching: bool = _opt(True, "reuse KV blocks of shared prompt prefixes")
    enforce_eager: bool = _opt(False, "never use CUDA graphs")
    cuda_graph_max_bs: int | None = _opt(None, "largest decode batch that replays a CUDA graph (default: "
                                               "max_num_seqs, at most 512; 0: decode steps run eagerly)")
    prefill_graph_max_tokens: int | None = _opt(None, "prompt steps of up to this many tokens (after padding) replay "
                                                      "a CUDA graph instead of an eager forward's launches (default: "
                                                      "the step budget, up to 8192); 0: none")
    overlap_scheduling: bool = _opt(True, "schedule step N+1 while the device runs step N")
    late_launch: bool = _opt(True, "with overlap, a server launches step N+1 just before step N ends (not as soon "
                                   "as N is queued), so requests arriving meanwhile join N+1 (launch_clock.py)")
    tensor_parallel_size: int = _opt(1, "GPUs one model is split across")
    attention_backend: str = _opt("auto", "auto, torch, triton or flash_attn")
    load_format: str = _opt("auto", "auto, or dummy for random weights (benchmarks)")
    seed: int = _opt(0, "seed of the engine's random state")
    warmup: bool = _opt(True, "on cuda, run each kind of step once before serving, so that no kernel is compiled "
                              "while serving (common/engine/warmup.py)")
    model_config: ModelConfig = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.model_config = ModelConfig.from_dir(self.model)
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(f"load_format: must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.load_format == "auto":  # found out here, in one line, before any worker starts
            weight_files(self.model)
        if self.device not in ("auto", *DEVICES):
            raise ConfigError(f"device: must be cpu or cuda, got {self.device!r}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"dtype: must be one of auto, {', '.join(DTYPES)}, got {self.dtype!r}")
        limit = self.model_config.max_position_embeddings
        self.max_model_len = min(self.max_model_len or limit, limit)
        if self.max_num_batched_tokens is None and self.device in DEVICES:
            self.max_num_batched_tokens = STEP_TOKENS[self.device]
        for name in ("cuda_graph_max_bs", "prefill_graph_max_tokens"):
            if (getattr(self, name) or 0) < 0:
                raise ConfigError(f"{name}: must be 0 or more, got {getattr(self, name)}")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
            value = getattr(self, name)  # max_num_batched_tokens is None only until the device is decided
            if value is not None and value <= 0:
                raise ConfigError(f"{name}: must be positive, got {value}")
        mc, tp = self.model_config, self.tensor_parallel_size
        if mc.num_heads % tp or (mc.num_kv_heads % tp and tp % mc.num_kv_heads):
            raise ConfigError(f"tensor_parallel_size: {tp} does not split {mc.num_heads} attention heads and "
                              f"{mc.num_kv_heads} KV heads evenly")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError("max_num_batched_tokens: must be at least max_num_seqs, so every decode fits a step")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")

    def on_device(self, device: str) -> EngineConfig:
        """This config with `device` (cpu or cuda) in place of auto; where the engine runs, `auto` means cuda when
        torch sees a GPU, and the launcher decides it from the Ray cluster's GPUs."""
        if self.device != "auto":
            return self
        if device not in DEVICES:
            raise ConfigError(f"device: must be cpu or cuda, got {device!r}")
        return dataclasses.replace(self, device=device)  # __post_init__ fills what depends on the device

    @property
    def dtype_name(self) -> str:
        """The engine's dtype: the one asked for, else the checkpoint's on cuda and float32 on cpu."""
        if self.dtype != "auto":
            return self.dtype
        if self.device == "auto":
            raise ConfigError("dtype: auto is decided once the device is (EngineConfig.on_device)")
        return self.model_config.dtype if self.device == "cuda" else "float32"
