"""The GPU benchmark scripts where there is no GPU: they import, parse their arguments and refuse to run in one
line; and the helpers they share (scripts/bench_gpu.py) count bytes as their docstrings say."""
from __future__ import annotations

import importlib

import pytest
import torch

from scripts import bench_gpu

# script: arguments that would run it
SCRIPTS = {"bench_engine": ["decode"], "bench_attention": ["--mixed"], "bench_transfer": ["--iters", "1"],
           "probe_links": ["--mb", "1"]}


@pytest.mark.parametrize("script", SCRIPTS)
def test_arguments_parse_without_a_gpu(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    module = importlib.import_module(f"scripts.{script}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {script}")


@pytest.mark.parametrize("script", SCRIPTS)
def test_without_a_gpu_the_script_says_so_in_one_line(script: str, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    module = importlib.import_module(f"scripts.{script}")
    with pytest.raises(SystemExit) as exit_:
        module.main(SCRIPTS[script])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(f"{script}: needs "), err


def test_copy_rates_count_payload_once_and_hbm_traffic_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    timed: list[tuple] = []

    def one_ms(fn, devices=(), iters=10, warmup=3, reps=1):
        fn()
        timed.append(tuple(devices))
        return 1e-3

    monkeypatch.setattr(bench_gpu, "median_seconds", one_ms)
    assert bench_gpu.copy_bandwidth("cpu", nbytes=10**6) == pytest.approx(1.0)  # 1 MB in 1 ms: 1 GB/s
    assert bench_gpu.hbm_bandwidth("cpu", nbytes=10**6) == pytest.approx(2.0)  # read + written
    assert timed == [(torch.device("cpu"), torch.device("cpu"))] * 2


def test_median_seconds_times_one_call_of_the_samples() -> None:
    calls = []
    seconds = bench_gpu.median_seconds(lambda: calls.append(1), devices=("cpu",), iters=5, warmup=2, reps=3)
    assert len(calls) == (5 + 2) * 3 and 0 <= seconds < 0.01


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8])
def test_decode_idle_reads_graphed_steps(tmp_path, batch: int) -> None:
    """Every decode step leaves its marks, also one whose LM head and sampler replay as a graph (they bypass
    `execute`): a step without a forward mark broke the bench's idle line at stop 44."""
    from scripts import bench_engine
    from scripts.model_prep import prepare_random

    path = prepare_random("qwen3-0.6b", tmp_path / "qwen3-0.6b", seed=0, dtype="bfloat16")
    llm = bench_engine.make_llm(path, max_num_seqs=16, max_model_len=512, gpu_memory_utilization=0.3)
    try:
        assert llm.engine.runner.sampler_graphs is not None
        ms, low, high = bench_engine.decode_idle(llm, batch, 256, steps=10)
        assert ms > 0 and 0.0 <= low <= high < 1.0
    finally:
        llm.close()
