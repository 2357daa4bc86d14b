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


def generate(model: Path, env: dict[str, str], prompts: list[str], *flags: str) -> list[list[int]] | str:
    """`pdcluster generate` in a process of its own (an MPS client's share is read as CUDA starts), greedy, its
    warm-up and graphs included: each prompt's tokens, or the error line it stopped on."""
    out = subprocess.run(
        [sys.executable, "-m", "scripts.cli", "generate", "--model", str(model), "--device", "cuda",
         "--gpu-memory-utilization", "0.3", "--max-tokens", "12", "--temperature", "0", "--ignore-eos", "--json",
         *[arg for prompt in prompts for arg in ("--prompt", prompt)], *flags],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return out.stderr.strip().splitlines()[-1]
    return [json.loads(line)["token_ids"] for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="no CUDA MPS control program")
@pytest.mark.parametrize("share", [50, 70])
def test_a_process_under_an_mps_cap_serves_right_tokens_or_refuses_its_share(qwen3_06b_dir, share):
    """Graphs replay the eager kernels exactly (tests/test_gpu_engine.py), capped too; where cuBLAS gets the model's
    GEMMs wrong at the share (70% on the H200s of stop 53: eagerly every token 0, NaN logits), both refuse to start,
    naming it (common/engine/mps_check.py). Against an uncapped process the tokens may differ: the kernels' launch
    choices follow the SMs a process sees, and one near-tie of a random model's logits flips a sequence."""
    prompts = ["hello there", "a longer prompt " * 20, "the same words again and again " * 60]
    vocab = json.loads((qwen3_06b_dir / "config.json").read_text())["vocab_size"]
    server = MpsServer({"prefill": 100, "decode": share})
    server.start()
    try:
        graphs = generate(qwen3_06b_dir, server.env("decode"), prompts)
        eager = generate(qwen3_06b_dir, server.env("decode"), prompts, "--enforce-eager")
    finally:
        server.stop()
    if isinstance(graphs, str):
        assert f"mps: at {share}% of the SMs cuBLAS returns wrong products" in graphs
        assert eager == graphs
        return
    assert [len(tokens) for tokens in graphs] == [12] * len(prompts)
    assert all(0 <= t < vocab for tokens in graphs for t in tokens) and len({t for s in graphs for t in s}) > 3
    assert graphs == eager
