from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from scripts.model_prep import cached_smollm2_dir

    return cached_smollm2_dir()


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory) -> Path:
    from scripts.model_prep import prepare_random

    return prepare_random("tiny-qwen3", tmp_path_factory.mktemp("models") / "tiny-qwen3", seed=0)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    from scripts.model_prep import prepare_random

    return prepare_random("tiny-llama", tmp_path_factory.mktemp("models") / "tiny-llama", seed=0)
