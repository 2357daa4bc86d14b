"""Serving figures from a load tool nobody here wrote: NVIDIA's aiperf against `pdcluster serve --http`, one cluster
per mode, started and stopped like a service. Prints one table (aiperf's own figures, from its JSON export) and keeps
aiperf's artifacts under --out/MODE.

    python -m scripts.bench_aiperf --model DIR --device cuda --modes disagg,colocated \\
        --prefill-workers 1 --decode-workers 1 --workers 2 --gpus-per-worker 1 \\
        --concurrency 32 --requests 512 --isl 1024 --osl 256 --out results/aiperf-qwen3-8b

With --rates, aiperf sends Poisson arrivals at each rate instead of a fixed concurrency; with --with-bench,
`pdcluster bench` (the ZMQ client) then sends the same load (rate, count, prompt and output lengths) to the same
cluster, and the table sets the two tools' TTFT and ITL / TPOT side by side.

aiperf lives in a venv of its own (`make aiperf`: .cache/aiperf-venv; it pins pyzmq, psutil and rich below ours; on
the offline GPU host, docs/gpu_runs/install_aiperf.sh).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from scripts.bench_server import REPO_ROOT, ServeProcess, free_port

FIGURES = [("request_throughput", "avg", "req/s"), ("output_token_throughput", "avg", "out tok/s"),
           ("time_to_first_token", "p50", "TTFT p50 ms"), ("time_to_first_token", "p90", "TTFT p90 ms"),
           ("time_to_first_token", "p99", "TTFT p99 ms"),
           ("inter_token_latency", "p50", "ITL p50 ms"), ("inter_token_latency", "p99", "ITL p99 ms"),
           ("request_latency", "p99", "e2e p99 ms")]
# The same figures from `pdcluster bench`'s summary (seconds): its TPOT is aiperf's ITL, (e2e - TTFT) / (tokens - 1)
# a request.
BENCH_FIGURES = [("request_throughput", None, 1.0), ("output_throughput", None, 1.0), ("ttft", "p50", 1e3),
                 ("ttft", "p90", 1e3), ("ttft", "p99", 1e3), ("tpot", "p50", 1e3), ("tpot", "p99", 1e3),
                 ("e2e", "p99", 1e3)]


def serve_command(args: argparse.Namespace, mode: str, port: int, bind: str) -> list[str]:
    cmd = ["pdcluster", "serve", "--model", str(Path(args.model).resolve()), "--mode", mode, "--device", args.device,
           "--bind", bind, "--http", f"127.0.0.1:{port}"]
    if mode == "disagg":
        cmd += ["--prefill-workers", str(args.prefill_workers), "--decode-workers", str(args.decode_workers)]
    else:
        cmd += ["--workers", str(args.workers)]
    return cmd + ["--gpus-per-worker", f"{args.gpus_per_worker:g}", *shlex.split(args.serve_args)]


def wait_healthy(url: str, server: ServeProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.exited() is not None:
            raise RuntimeError(f"serve exited ({server.exited()}):\n{server.log_tail()}")
        try:
            with urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (URLError, OSError):
            pass
        time.sleep(2)
    raise RuntimeError(f"serve not healthy after {timeout:g} s:\n{server.log_tail()}")


def aiperf_command(args: argparse.Namespace, url: str, out: Path, rate: float | None = None) -> list[str]:
    model = str(Path(args.model).resolve())
    load = (["--concurrency", str(args.concurrency)] if rate is None
            else ["--request-rate", f"{rate:g}", "--arrival-pattern", "poisson"])
    return [args.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", args.endpoint, "--streaming",
            *load, "--request-count", str(args.requests),
            "--warmup-request-count", str(args.warmup), "--isl", str(args.isl), "--osl", str(args.osl),
            "--extra-inputs", "ignore_eos:true", "--tokenizer", model, "--use-server-token-count",
            "--random-seed", str(args.seed), "--ui", "none", "--artifact-dir", str(out), *shlex.split(args.aiperf_args)]


def bench_command(args: argparse.Namespace, address: str, rate: float, out: Path) -> list[str]:
    """`pdcluster bench` over ZMQ against the running cluster, with aiperf's load: Poisson at `rate`, as many
    requests (after as many warm-up ones), prompts and outputs of exactly --isl and --osl tokens."""
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    return [sys.executable, "-m", "scripts.cli", "bench", "--address", address, "--vocab-size", str(vocab),
            "--rates", f"{rate:g}",
            "--num-requests", str(args.requests), "--warmup-requests", str(args.warmup), "--unloaded-requests", "0",
            "--input-len", str(args.isl), "--output-len", str(args.osl), "--seed", str(args.seed), "--out", str(out)]


def aiperf_row(summary: dict) -> list:
    errors = sum(e.get("count", 0) for e in summary.get("error_summary") or [])
    return [summary["request_count"]["avg"], errors] + [(summary.get(name) or {}).get(stat, float("nan"))
                                                        for name, stat, _ in FIGURES]


def bench_row(results: dict) -> list:
    summary = results["runs"][0]["points"][0]["summary"]
    return [summary["completed"], summary["failed"]] + [
        (summary[name][stat] if stat else summary[name]) * scale for name, stat, scale in BENCH_FIGURES]


def aiperf_env(where: Path) -> dict[str, str]:
    """aiperf's environment: its memory-mapped dataset files in the run's own folder, not one folder a run left in
    the system's temp directory."""
    return {**os.environ, "AIPERF_DATASET_MMAP_BASE_PATH": str(where)}


def run_mode(args: argparse.Namespace, mode: str, rates: list[float | None]) -> list[list]:
    """One cluster for `mode`; aiperf (and, with --with-bench, `pdcluster bench`) at each load; a row for each."""
    rows = []
    out = args.out / mode
    out.mkdir(parents=True, exist_ok=True)
    port, bind = free_port(), f"tcp://127.0.0.1:{free_port()}"
    server = ServeProcess(serve_command(args, mode, port, bind), out / "serve.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, server, args.startup_timeout)
        for rate in rates:
            load = "" if rate is None else f"{rate:g} req/s"
            where = out if rate is None else out / f"rate-{rate:g}"
            where.mkdir(parents=True, exist_ok=True)
            run = subprocess.run(aiperf_command(args, url, where, rate), cwd=where, capture_output=True, text=True,
                                 env=aiperf_env(where))
            (where / "aiperf.log").write_text(run.stdout + run.stderr)
            if run.returncode != 0:
                print(f"{mode} {load}: aiperf failed ({run.returncode}), see {where / 'aiperf.log'}", file=sys.stderr)
            else:
                summary = json.loads((where / "profile_export_aiperf.json").read_text())
                rows.append([mode, load, "aiperf (HTTP)"] + aiperf_row(summary))
            if args.with_bench and rate is not None:
                run = subprocess.run(bench_command(args, bind, rate, where / "bench"), cwd=REPO_ROOT,
                                     capture_output=True, text=True)
                (where / "bench.log").write_text(run.stdout + run.stderr)
                if run.returncode != 0:
                    print(f"{mode} {load}: pdcluster bench failed ({run.returncode}), see {where / 'bench.log'}",
                          file=sys.stderr)
                else:
                    rows.append([mode, load, "pdcluster bench (ZMQ)"]
                                + bench_row(json.loads((where / "bench" / "results.json").read_text())))
    finally:
        server.stop()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--modes", default="disagg,colocated")
    p.add_argument("--prefill-workers", type=int, default=1)
    p.add_argument("--decode-workers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="colocated replicas")
    p.add_argument("--gpus-per-worker", type=float, default=1.0)
    p.add_argument("--serve-args", default="", help="more `pdcluster serve` flags (use --serve-args='...')")
    p.add_argument("--aiperf", default=str(REPO_ROOT / ".cache" / "aiperf-venv" / "bin" / "aiperf"))
    p.add_argument("--aiperf-args", default="", help="more aiperf flags")
    p.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rates", default="", help="comma list of request rates (Poisson arrivals): one aiperf run a "
                                               "rate instead of the fixed --concurrency")
    p.add_argument("--with-bench", action="store_true", help="with --rates: `pdcluster bench` sends the same load "
                                                             "to the same cluster after aiperf, at each rate")
    p.add_argument("--requests", type=int, default=512)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--isl", type=int, default=1024)
    p.add_argument("--osl", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--out", type=Path, default=Path("results/aiperf"))
    args = p.parse_args()
    if not Path(args.aiperf).exists():
        sys.exit(f"bench_aiperf: no aiperf at {args.aiperf} (make aiperf)")
    try:
        rates = [float(r) for r in args.rates.split(",") if r.strip()] or [None]
    except ValueError:
        sys.exit(f"bench_aiperf: --rates: not a comma list of numbers: {args.rates!r}")
    if args.with_bench and rates == [None]:
        sys.exit("bench_aiperf: --with-bench needs --rates (pdcluster bench runs open-loop rates here)")

    rows = [row for mode in args.modes.split(",") for row in run_mode(args, mode, rates)]
    header = ["mode", "load", "tool", "requests", "errors"] + [label for _, _, label in FIGURES]
    header[-3] = "ITL (aiperf) / TPOT (bench) p50 ms"
    header[-2] = "ITL / TPOT p99 ms"
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row))


if __name__ == "__main__":
    main()
