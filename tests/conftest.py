from __future__ import annotations

import os
import subprocess
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
def qwen3_06b_dir(tmp_path_factory) -> Path:
    """Qwen3-0.6B's shapes with random bf16 weights (the GPU tests' model)."""
    from scripts.model_prep import prepare_random

    return prepare_random("qwen3-0.6b", tmp_path_factory.mktemp("models") / "qwen3-0.6b", seed=0, dtype="bfloat16")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    from scripts.model_prep import prepare_random

    return prepare_random("tiny-llama", tmp_path_factory.mktemp("models") / "tiny-llama", seed=0)


# --- NVIDIA's aiperf, a load tool nobody here wrote ----------------------------------------------------------

AIPERF_VERSION = "0.13.0"


@pytest.fixture(scope="session")
def aiperf() -> Path:
    """aiperf in a venv of its own (it pins pyzmq, psutil and rich below ours): .cache/aiperf-venv, made once."""
    venv = ROOT / ".cache" / "aiperf-venv"
    exe = venv / "bin" / "aiperf"
    if not exe.exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
        if made.returncode == 0:
            made = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"aiperf=={AIPERF_VERSION}"],
                                  capture_output=True, text=True, timeout=900)
        if made.returncode != 0 or not exe.exists():
            pytest.skip(f"cannot install aiperf=={AIPERF_VERSION} in {venv}: {made.stderr[-500:]}")
    return exe
