"""scripts/bench_aiperf.py's rate mode: aiperf and `pdcluster bench` send the same Poisson load to one CPU cluster,
and the table sets both tools' figures side by side."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_aiperf_and_bench_send_the_same_load_to_one_cluster(tiny_qwen3_dir, aiperf, tmp_path):
    requests = 8
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.bench_aiperf", "--model", str(tiny_qwen3_dir), "--device", "cpu",
         "--modes", "colocated", "--workers", "1", "--rates", "4", "--with-bench", "--requests", str(requests),
         "--warmup", "2", "--isl", "32", "--osl", "8", "--aiperf", str(aiperf), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    header = lines[0].split(" | ")
    rows = [dict(zip(header, line.split(" | "))) for line in lines[1:]]
    assert [r["tool"] for r in rows] == ["aiperf (HTTP)", "pdcluster bench (ZMQ)"]
    for row in rows:
        assert row["mode"] == "colocated" and row["load"] == "4 req/s"
        assert float(row["requests"]) == requests and row["errors"] == "0"
        assert 0 < float(row["TTFT p50 ms"]) <= float(row["TTFT p99 ms"])
        # A busy host can flush several streamed tokens in one HTTP chunk: aiperf then reads gaps of ~0 ms between
        # them, so its median may print as 0.0; the tail cannot.
        assert 0 <= float(row["ITL (aiperf) / TPOT (bench) p50 ms"]) <= float(row["ITL / TPOT p99 ms"])
        assert float(row["ITL / TPOT p99 ms"]) > 0
    assert (tmp_path / "colocated" / "rate-4" / "profile_export_aiperf.json").exists()
    assert (tmp_path / "colocated" / "rate-4" / "bench" / "results.json").exists()
    assert list((tmp_path / "colocated" / "rate-4").glob("aiperf_mmap_*"))  # its dataset files, not in /tmp


def test_with_bench_needs_rates(tiny_qwen3_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "scripts.bench_aiperf", "--model", str(tiny_qwen3_dir), "--with-bench",
                           "--aiperf", sys.executable, "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "--with-bench needs --rates" in proc.stderr
