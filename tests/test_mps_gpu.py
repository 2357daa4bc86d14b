"""A process capped to a share of the SMs under CUDA MPS (`serve --mps` caps the decode worker) samples the tokens an
uncapped one does, through the decode step's CUDA graphs and the fused LM head and sampler's (stop 48: capped, the
sampler's graphs, sharing the decode graphs' memory pool, returned a token beyond the vocabulary).

Run on the GPU host: `python -m pytest -m gpu tests/test_mps_gpu.py`. It starts an MPS control daemon of its own
(router/mps.py), as `serve --mps` does."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from router.mps import MpsServer

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def qwen3_06b_dir(tmp_path_factory):
    from scripts.model_prep import prepare_random

    return prepare_random("qwen3-0.6b", tmp_path_factory.mktemp("m") / "qwen3-0.6b", seed=0, dtype="bfloat16")


def generate(model: Path, env: dict[str, str], prompts: list[str]) -> list[list[int]]:
    """`pdcluster generate` in a process of its own (an MPS client's share is read as CUDA starts), greedy, its
    warm-up and graphs included: each prompt's tokens."""
    out = subprocess.run(
        [sys.executable, "-m", "scripts.cli", "generate", "--model", str(model), "--device", "cuda",
         "--gpu-memory-utilization", "0.3", "--max-tokens", "12", "--temperature", "0", "--ignore-eos", "--json",
         *[arg for prompt in prompts for arg in ("--prompt", prompt)]],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return [row["token_ids"] for row in rows]


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="no CUDA MPS control program")
def test_a_process_under_an_mps_cap_samples_the_tokens_of_an_uncapped_one(qwen3_06b_dir):
    prompts = ["hello there", "a longer prompt " * 20, "the same words again and again " * 60]
    alone = generate(qwen3_06b_dir, {}, prompts)
    server = MpsServer({"prefill": 100, "decode": 70})
    server.start()
    try:
        capped = generate(qwen3_06b_dir, server.env("decode"), prompts)
    finally:
        server.stop()
    assert len(alone) == len(prompts) and all(len(tokens) == 12 for tokens in alone)
    assert capped == alone
