"""Serving figures from a load tool nobody here wrote: NVIDIA's aiperf against `pdcluster serve --http`, one cluster
per mode, started and stopped like a service. Prints one table (aiperf's own figures, from its JSON export) and keeps
aiperf's artifacts under --out/MODE.

    python -m scripts.bench_aiperf --model DIR --device cuda --modes disagg,colocated \\
        --prefill-workers 1 --decode-workers 1 --workers 2 --gpus-per-worker 1 \\
        --concurrency 32 --requests 512 --isl 1024 --osl 256 --out results/aiperf-qwen3-8b

aiperf lives in a venv of its own (`make aiperf`: .cache/aiperf-venv; it pins pyzmq, psutil and rich below ours).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from scripts.bench_server import REPO_ROOT, ServeProcess, free_port

FIGURES = [("request_throughput", "avg", "req/s"), ("output_token_throughput", "avg", "out tok/s"),
           ("time_to_first_token", "p50", "TTFT p50 ms"), ("time_to_first_token", "p99", "TTFT p99 ms"),
           ("inter_token_latency", "p50", "ITL p50 ms"), ("inter_token_latency", "p99", "ITL p99 ms"),
           ("request_latency", "p99", "e2e p99 ms")]


def serve_command(args: argparse.Namespace, mode: str, port: int) -> list[str]:
    cmd = ["pdcluster", "serve", "--model", str(Path(args.model).resolve()), "--mode", mode, "--device", args.device,
           "--bind", f"tcp://127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{port}"]
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


def aiperf_command(args: argparse.Namespace, url: str, out: Path) -> list[str]:
    model = str(Path(args.model).resolve())
    return [args.aiperf, "profile", "--model", model, "--url", url, "--endpoint-type", args.endpoint, "--streaming",
            "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
            "--warmup-request-count", str(args.warmup), "--isl", str(args.isl), "--osl", str(args.osl),
            "--extra-inputs", "ignore_eos:true", "--tokenizer", model, "--use-server-token-count",
            "--random-seed", str(args.seed), "--ui", "none", "--artifact-dir", str(out), *shlex.split(args.aiperf_args)]


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

    rows = []
    for mode in args.modes.split(","):
        out = args.out / mode
        out.mkdir(parents=True, exist_ok=True)
        port = free_port()
        server = ServeProcess(serve_command(args, mode, port), out / "serve.log")
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, server, args.startup_timeout)
            run = subprocess.run(aiperf_command(args, url, out), cwd=out, capture_output=True, text=True)
            (out / "aiperf.log").write_text(run.stdout + run.stderr)
            if run.returncode != 0:
                print(f"{mode}: aiperf failed ({run.returncode}), see {out / 'aiperf.log'}", file=sys.stderr)
                continue
            summary = json.loads((out / "profile_export_aiperf.json").read_text())
            errors = sum(e.get("count", 0) for e in summary.get("error_summary") or [])
            rows.append([mode, summary["request_count"]["avg"], errors] +
                        [(summary.get(name) or {}).get(stat, float("nan")) for name, stat, _ in FIGURES])
        finally:
            server.stop()
    header = ["mode", "requests", "errors"] + [label for _, _, label in FIGURES]
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in row))


if __name__ == "__main__":
    main()
