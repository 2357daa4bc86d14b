"""Serving benchmark: disaggregated vs colocated clusters under the same load, measured at the client.

    pdcluster bench --model DIR --modes disagg,colocated --rates 1,2,4,8 --out OUT      # open loop, Poisson
    pdcluster bench --model DIR --concurrency 1,8,32 --out OUT                          # closed loop
    pdcluster bench --address tcp://HOST:5555 --vocab-size 151936 --rates 4 --out OUT   # a running cluster
    python -m scripts.cli bench ...                                                     # the same

For each mode it starts `pdcluster serve` (a subprocess, log in OUT/serve-MODE.log), waits until the
cluster can serve, sends a few warm-up requests, then --unloaded-requests one at a time (the unloaded
reference), then every load point in turn on one AsyncClient, and stops the cluster with SIGTERM.
Prompts are random token ids, outputs run to exactly their length (ignore_eos, greedy), and a seed makes
every request and arrival time repeatable. OUT gets results.json, report.md and PNG plots
(scripts/bench_report.py); docs/benchmarks.md explains how to read them.

Workloads (--workload): random (--input-len/--output-len, N or LO:HI), long-short (a --long-fraction of
long-prompt/short-answer requests among ordinary ones), shared-prefix (--num-prefixes system prompts of
--prefix-len tokens before each prompt), trace (--trace FILE, JSON lines of arrival, input_len,
output_len; replayed as recorded, or scaled to each of --rates).

Fair comparisons use the same hardware for both modes:

    # 2 GPUs: 1 prefill + 1 decode worker vs 2 colocated replicas, a GPU each
    pdcluster bench --model DIR --device cuda --prefill-workers 1 --decode-workers 1 --workers 2 \\
        --gpus-per-worker 1 --rates 2,4,8,16 --out OUT
    # 1 GPU: prefill and decode share it (half its memory each) vs one colocated replica on all of it
    pdcluster bench --model DIR --device cuda --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 \\
        --workers 1 --colocated-gpus-per-worker 1 --rates 2,4,8,16 --out OUT
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common.sampling_params import InvalidRequest
from scripts import bench_workloads as W
from scripts.bench_metrics import SLO, RequestRecord, summarize
from scripts.bench_workloads import BenchRequest, LengthRange, TraceEntry

log = logging.getLogger("pdcluster.bench")

REPO_ROOT = Path(__file__).resolve().parent.parent
MODES = ("disagg", "colocated")
WORKLOADS = ("random", "long-short", "shared-prefix", "trace")
DEFAULT_RATES = "1,2,4,8"
DEFAULT_NUM_REQUESTS = 100
READY_POLL_S = 2.0  # between checks that `serve` is still alive while waiting for it
STOP_TIMEOUT_S = 120.0


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class BenchConfig:
    out: str = field(metadata={"help": "folder for results.json, report.md, the plots and the serve logs"})
    model: str | None = _opt(None, "checkpoint folder: what the started clusters serve; its config gives the "
                                   "vocabulary size")
    address: str | None = _opt(None, "benchmark the cluster running at this router address instead of "
                                     "starting one per mode")
    modes: str | None = _opt(None, "comma list of disagg, colocated (default: both; with --address: the "
                                   "running cluster's)")
    rates: str | None = _opt(None, f"comma list of Poisson arrival rates, requests/s; inf = all at once "
                                   f"(default: {DEFAULT_RATES})")
    concurrency: str | None = _opt(None, "comma list of closed-loop concurrencies, instead of --rates")
    num_requests: int | None = _opt(None, f"requests per load point (default: {DEFAULT_NUM_REQUESTS}; "
                                          "a trace's: all its lines)")
    warmup_requests: int = _opt(4, "requests sent to each cluster before measuring, not counted")
    unloaded_requests: int = _opt(8, "requests sent one at a time after the warm-up, before the load points: "
                                     "each mode's unloaded reference (0: none)")
    workload: str = _opt("random", "random, long-short, shared-prefix or trace")
    input_len: str = _opt("512", "prompt tokens, N or LO:HI (uniform); shared-prefix: after the system prompt")
    output_len: str = _opt("128", "output tokens, N or LO:HI (uniform)")
    long_input_len: str = _opt("4096", "long-short: prompt tokens of the long requests")
    long_output_len: str = _opt("16", "long-short: output tokens of the long requests")
    long_fraction: float = _opt(0.25, "long-short: share of long requests")
    prefix_len: int = _opt(1024, "shared-prefix: tokens of each system prompt")
    num_prefixes: int = _opt(4, "shared-prefix: distinct system prompts")
    trace: str | None = _opt(None, "trace workload: JSON lines {\"arrival\": s, \"input_len\": n, "
                                   "\"output_len\": n}")
    slo_ttft: float = _opt(1.0, "SLO on time to first token, seconds")
    slo_tpot: float = _opt(0.05, "SLO on time per output token after the first, seconds")
    seed: int = _opt(0, "seed of prompts, lengths and arrival times")
    vocab_size: int | None = _opt(None, "prompt token ids are below this (default: the model's vocab_size)")
    request_timeout: float = _opt(600.0, "seconds one request may take before it counts as failed")
    ready_timeout: float = _opt(900.0, "seconds a started cluster may take to become ready")
    device: str = _opt("auto", "serve: cpu, cuda or auto")
    prefill_workers: int = _opt(1, "serve, disagg: prefill workers")
    decode_workers: int = _opt(1, "serve, disagg: decode workers")
    workers: int = _opt(1, "serve, colocated: engine replicas")
    gpus_per_worker: float = _opt(1.0, "serve: GPUs per worker (0.5 puts two workers on one GPU)")
    colocated_gpus_per_worker: float | None = _opt(None, "serve, colocated: GPUs per worker (default: "
                                                         "--gpus-per-worker)")
    serve_args: str = _opt("", "more `pdcluster serve` flags for every cluster, e.g. "
                               "--serve-args='--max-num-seqs 128 --enforce-eager'")

    def __post_init__(self) -> None:
        if not self.address and not self.model:
            raise ValueError("bench: --model is required to start clusters (or give --address)")
        if self.address and (self.modes or "").count(",") > 0:
            raise ValueError("bench: --address benchmarks one running cluster: give at most one mode")
        for mode in self.mode_list():
            if mode not in MODES:
                raise ValueError(f"--modes: expected disagg and/or colocated, got {mode!r}")
        if self.rates and self.concurrency:
            raise ValueError("bench: give --rates (open loop) or --concurrency (closed loop), not both")
        self.rate_list()
        self.concurrency_list()
        if self.workload not in WORKLOADS:
            raise ValueError(f"--workload: expected one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if (self.workload == "trace") != (self.trace is not None):
            raise ValueError("bench: --trace FILE goes with --workload trace, and only with it")
        for name in ("input_len", "output_len", "long_input_len", "long_output_len"):
            self.lengths(name)
        if not 0 <= self.long_fraction <= 1:
            raise ValueError(f"--long-fraction: must be in [0, 1], got {self.long_fraction:g}")
        positive = ("prefix_len", "num_prefixes", "num_requests", "prefill_workers", "decode_workers", "workers",
                    "vocab_size", "slo_ttft", "slo_tpot", "request_timeout", "ready_timeout", "gpus_per_worker",
                    "colocated_gpus_per_worker")
        for name in positive:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be > 0, got {value:g}")
        for name in ("warmup_requests", "unloaded_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(self, name)}")
        try:
            shlex.split(self.serve_args)
        except ValueError as e:
            raise ValueError(f"--serve-args: {e}") from None

    def mode_list(self) -> list[str]:
        modes = [m.strip() for m in (self.modes or ("" if self.address else ",".join(MODES))).split(",") if m.strip()]
        if len(set(modes)) != len(modes):
            raise ValueError(f"--modes: a mode is named twice in {self.modes!r}")
        return modes

    def rate_list(self) -> list[float]:
        rates = []
        for item in (self.rates or DEFAULT_RATES).split(","):
            try:
                rate = float(item)
            except ValueError:
                raise ValueError(f"--rates: expected numbers (requests/s) or inf, got {item.strip()!r}") from None
            if not rate > 0 or math.isnan(rate):
                raise ValueError(f"--rates: must be > 0, got {item.strip()!r}")
            rates.append(rate)
        return rates

    def concurrency_list(self) -> list[int]:
        if not self.concurrency:
            return []
        try:
            values = [int(item) for item in self.concurrency.split(",")]
        except ValueError:
            raise ValueError(f"--concurrency: expected integers, got {self.concurrency!r}") from None
        if min(values) < 1:
            raise ValueError(f"--concurrency: must be >= 1, got {self.concurrency!r}")
        return values

    def lengths(self, name: str) -> LengthRange:
        try:
            return LengthRange.parse(getattr(self, name))
        except ValueError as e:
            raise ValueError(f"--{name.replace('_', '-')}: {e}") from None


# ---- load points and workloads ------------------------------------------------------------------
@dataclass(frozen=True)
class LoadPoint:
    kind: str  # "rate": Poisson (or a trace scaled to it); "concurrency": closed loop; "trace": as recorded
    value: float  # requests/s (inf: all at once), concurrent requests, or the recorded trace's mean rate

    @property
    def label(self) -> str:
        if self.kind == "concurrency":
            return f"concurrency {self.value:g}"
        if self.kind == "trace":
            return f"trace as recorded ({self.value:.3g} req/s)"
        return "all at once" if math.isinf(self.value) else f"{self.value:g} req/s"

    def to_json(self) -> dict:
        axis = {"rate": "request rate (req/s)", "concurrency": "concurrent requests (closed loop)",
                "trace": "trace"}[self.kind]
        short = "trace" if self.kind == "trace" else f"{self.value:g}"
        value = self.value if math.isfinite(self.value) else None
        return {"kind": self.kind, "value": value, "label": self.label, "short": short, "axis": axis}


UNLOADED = LoadPoint("concurrency", 1)  # one request at a time: nothing else shares the cluster


def load_points(cfg: BenchConfig, trace: list[TraceEntry] | None) -> list[LoadPoint]:
    if cfg.concurrency:
        return [LoadPoint("concurrency", c) for c in cfg.concurrency_list()]
    if trace is not None and not cfg.rates:
        return [LoadPoint("trace", W.trace_rate([e.arrival for e in trace]))]
    return [LoadPoint("rate", r) for r in cfg.rate_list()]


def build_requests(cfg: BenchConfig, rng: random.Random, n: int, vocab: int,
                   trace: list[TraceEntry] | None) -> list[BenchRequest]:
    if trace is not None:
        return W.trace_requests(rng, trace[:n], vocab)
    ins, outs = cfg.lengths("input_len"), cfg.lengths("output_len")
    if cfg.workload == "long-short":
        return W.long_short_mix(rng, n, vocab, ins, outs, cfg.lengths("long_input_len"),
                                cfg.lengths("long_output_len"), cfg.long_fraction)
    if cfg.workload == "shared-prefix":
        return W.shared_prefix_mix(rng, n, vocab, cfg.prefix_len, cfg.num_prefixes, ins, outs)
    return W.random_requests(rng, n, vocab, ins, outs)


def arrivals(cfg: BenchConfig, point: LoadPoint, index: int, requests: list[BenchRequest]) -> list[float]:
    """When each request of an open-loop point is sent, in seconds after the point's start."""
    if point.kind == "trace":
        return [r.arrival for r in requests]
    if requests and requests[0].arrival is not None:
        return W.scale_arrivals([r.arrival for r in requests], point.value)
    return W.poisson_arrivals(random.Random(f"{cfg.seed}:{index}:arrivals"), len(requests), point.value)


def describe_workload(cfg: BenchConfig, n: int) -> str:
    io = f"input {cfg.input_len}, output {cfg.output_len} tokens"
    if cfg.workload == "trace":
        return f"trace {cfg.trace} ({n} requests per load point)"
    if cfg.workload == "long-short":
        io = (f"{100 * cfg.long_fraction:g}% long (input {cfg.long_input_len}, output {cfg.long_output_len}), "
              f"the others {io}")
    elif cfg.workload == "shared-prefix":
        io = f"one of {cfg.num_prefixes} system prompts of {cfg.prefix_len} tokens + {io}"
    return f"{cfg.workload}: {io}; {n} requests per load point"


def model_vocab_size(cfg: BenchConfig) -> int:
    if cfg.vocab_size:
        return cfg.vocab_size
    if not cfg.model:
        raise ValueError("bench: --vocab-size is required with --address and no --model")
    path = Path(cfg.model) / "config.json"
    try:
        return int(json.loads(path.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--model: cannot read vocab_size from {str(path)!r}: {e}") from None


# ---- the cluster --------------------------------------------------------------------------------
class ClusterError(Exception):
    """A cluster that would not start, or died: its mode's run stops, the others go on."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(cfg: BenchConfig, mode: str, address: str) -> list[str]:
    """`pdcluster serve ...` for one mode, as a user would type it."""
    cmd = ["pdcluster", "serve", "--model", str(Path(cfg.model).resolve()), "--mode", mode, "--bind", address,
           "--device", cfg.device]
    if mode == "disagg":
        cmd += ["--prefill-workers", str(cfg.prefill_workers), "--decode-workers", str(cfg.decode_workers),
                "--gpus-per-worker", f"{cfg.gpus_per_worker:g}"]
    else:
        gpus = cfg.colocated_gpus_per_worker or cfg.gpus_per_worker
        cmd += ["--workers", str(cfg.workers), "--gpus-per-worker", f"{gpus:g}"]
    return cmd + shlex.split(cfg.serve_args)


class ServeProcess:
    """`pdcluster serve` as a subprocess in its own process group, stopped with SIGTERM like a service."""

    def __init__(self, command: list[str], log_path: Path):
        self.command = command
        self.log_path = log_path
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", *command[1:]], env=env,
                                         stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def exited(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> int:
        """SIGTERM, wait, SIGKILL if it hangs; whatever it left in its process group is killed too."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("serve did not stop within %g s of SIGTERM: killing it", STOP_TIMEOUT_S)
                self.proc.kill()
                self.proc.wait()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
            log.warning("serve left processes behind in its group %d: killed them", self.proc.pid)
        except ProcessLookupError:
            pass
        return self.proc.returncode


async def wait_ready(client: Any, server: ServeProcess | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    problem = "the router did not answer"
    while True:
        if server is not None and (status := server.exited()) is not None:
            log.error("serve log (%s):\n%s", server.log_path, server.log_tail())
            raise ClusterError(f"serve exited with status {status} before it was ready (log: {server.log_path})")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClusterError(f"{problem} (after {timeout:g} s)")
        try:
            await client.wait_ready(min(left, READY_POLL_S))
            return
        except TimeoutError as e:
            problem = str(e)


async def infer_mode(address: str) -> str:
    """A running cluster's mode, from the roles of its workers."""
    from router.client import AsyncClient

    async with AsyncClient(address) as client:
        stats = await client.stats(timeout=10)
    return "colocated" if any(w.role == "colocated" for w in stats.workers) else "disagg"


# ---- one request, one load point ----------------------------------------------------------------
async def send(client: Any, index: int, req: BenchRequest, t0: float, timeout: float) -> RequestRecord:
    """Stream one request and time it. Every failure becomes a record: nothing is dropped."""
    from router.client import ClientError, ClientTimeout, ServerError

    start = time.perf_counter()
    rec = RequestRecord(index=index, prompt_len=len(req.prompt_ids), output_len=req.output_len,
                        start=start - t0, end=start - t0)
    last = None
    try:
        stream = client.stream(req.prompt_ids, timeout=timeout, max_tokens=req.output_len, ignore_eos=True,
                               temperature=0.0)
        async for delta in stream:
            if not delta.token_ids:
                continue
            now = time.perf_counter()
            if last is None:
                rec.ttft = now - start
            else:
                rec.itl.append(now - last)
            last = now
        rec.output_tokens = len(stream.result.token_ids)
        rec.finish_reason = stream.result.finish_reason
        if rec.finish_reason == "abort":
            rec.error_code, rec.error = "abort", "the request ended with finish_reason abort"
    except ServerError as e:
        rec.error_code, rec.error = e.code, str(e)
    except ClientTimeout as e:
        rec.error_code, rec.error = "client_timeout", str(e)
    except ClientError as e:
        rec.error_code, rec.error = "client_error", str(e)
    except InvalidRequest as e:
        rec.error_code, rec.error = "invalid_request", str(e)
    rec.end = time.perf_counter() - t0
    return rec


async def run_point(client: Any, point: LoadPoint, requests: list[BenchRequest], times: list[float] | None,
                    timeout: float, bar: Any, alive: Callable[[], bool] = lambda: True) -> list[RequestRecord]:
    """Open loop (`times` given: send each request at its time, whatever is in flight) or closed loop.

    Once the cluster is no longer `alive`, the remaining requests go at once (and fail at once).
    """
    t0 = time.perf_counter()

    async def one(i: int, req: BenchRequest) -> RequestRecord:
        rec = await send(client, i, req, t0, timeout)
        bar.update(1)
        return rec

    if times is not None:
        tasks = []
        for i, (req, at) in enumerate(zip(requests, times)):
            delay = t0 + at - time.perf_counter()
            if delay > 0 and alive():
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, req)))
        return list(await asyncio.gather(*tasks))

    queue = iter(enumerate(requests))  # shared: each request is taken by one loop

    async def loop() -> list[RequestRecord]:
        return [await one(i, req) for i, req in queue]

    done = await asyncio.gather(*(loop() for _ in range(min(int(point.value), len(requests)))))
    return sorted((r for records in done for r in records), key=lambda r: r.index)


# Two worker heartbeats: the router's stats then hold every step of what just ran.
HEARTBEAT_WAIT_S = 1.0
TOTALS = ("busy_steps", "busy_seconds", "prefill_tokens_run", "decode_tokens_run", "gpu_seconds")


async def engine_totals(client: Any) -> dict[str, dict] | None:
    """Each worker's engine totals (`WorkerStats`), after the heartbeats settle; None if stats fail."""
    await asyncio.sleep(HEARTBEAT_WAIT_S)
    try:
        stats = await client.stats(timeout=10)
    except Exception as e:  # a benchmark of a cluster that cannot say this still measures latencies
        log.warning("no engine totals from the cluster's stats: %s", e)
        return None
    return {w.worker_id: {"role": w.role, **{k: getattr(w, k, 0) for k in TOTALS}} for w in stats.workers}


def engine_activity(before: dict[str, dict] | None, after: dict[str, dict] | None) -> list[dict] | None:
    """What each worker's engine ran over a load point: the differences of its totals."""
    if before is None or after is None:
        return None
    return [{"worker_id": wid, "role": a["role"], **{k: a.get(k, 0) - before[wid].get(k, 0) for k in TOTALS}}
            for wid, a in sorted(after.items()) if wid in before]


async def bench_cluster(cfg: BenchConfig, run: dict, server: ServeProcess | None, points: list[LoadPoint],
                        workloads: list[list[BenchRequest]], warmup: list[BenchRequest],
                        unloaded: list[BenchRequest]) -> None:
    """Warm up one cluster, serve the unloaded requests one at a time, then run every load point on it.

    Results go into `run` as they come.
    """
    from tqdm import tqdm

    from router.client import AsyncClient

    mode, slo = run["mode"], SLO(cfg.slo_ttft, cfg.slo_tpot)

    def alive() -> bool:
        return server is None or server.exited() is None

    async def measure(label: str, point: LoadPoint, requests: list[BenchRequest], times: list[float] | None) -> dict:
        before = await engine_totals(client)
        with tqdm(total=len(requests), desc=f"{mode} {label}", file=sys.stderr, dynamic_ncols=True) as bar:
            records = await run_point(client, point, requests, times, cfg.request_timeout, bar, alive)
        result = {"load": point.to_json(), "summary": asdict(summarize(records, slo)),
                  "requests": [r.to_json() for r in records],
                  "engines": engine_activity(before, await engine_totals(client))}
        print(summary_line(mode, label, result["summary"]), flush=True)
        return result

    def check_alive(label: str) -> None:
        if not alive():
            raise ClusterError(f"serve exited with status {server.exited()} during {label} (log: {server.log_path})")

    async with AsyncClient(run["address"]) as client:
        await wait_ready(client, server, cfg.ready_timeout)
        watchdog = asyncio.create_task(watch(server, client)) if server is not None else None
        try:
            with tqdm(total=len(warmup), desc=f"{mode} warm-up", file=sys.stderr, dynamic_ncols=True) as bar:
                records = await run_point(client, LoadPoint("rate", math.inf), warmup, [0.0] * len(warmup),
                                          cfg.request_timeout, bar)
            failed = [r for r in records if not r.ok]
            run["warmup"] = {"requests": len(records), "failed": len(failed),
                             "errors": [f"{r.error_code}: {r.error}" for r in failed]}
            if unloaded:
                run["unloaded"] = await measure("unloaded", UNLOADED, unloaded, None)
                check_alive("the unloaded requests")
            for i, (point, requests) in enumerate(zip(points, workloads)):
                times = None if point.kind == "concurrency" else arrivals(cfg, point, i, requests)
                run["points"].append(await measure(point.label, point, requests, times))
                check_alive(point.label)
        finally:
            if watchdog is not None:
                watchdog.cancel()


async def watch(server: ServeProcess, client: Any) -> None:
    """If serve dies mid-run, close the client: every waiting request fails at once instead of timing out."""
    while server.exited() is None:
        await asyncio.sleep(1.0)
    log.error("serve exited with status %s; log (%s):\n%s", server.exited(), server.log_path, server.log_tail())
    await client.close()


def summary_line(mode: str, label: str, s: dict) -> str:
    def ms(d: dict, stat: str) -> str:
        return "n/a" if d[stat] is None else f"{d[stat] * 1e3:.1f}"

    return (f"{mode:<10} {label:<22} {s['completed']}/{s['requests']} ok"
            f"  ttft p50/p99 {ms(s['ttft'], 'p50')}/{ms(s['ttft'], 'p99')} ms"
            f"  tpot p50/p99 {ms(s['tpot'], 'p50')}/{ms(s['tpot'], 'p99')} ms"
            f"  {s['output_throughput']:.1f} tok/s  goodput {s['goodput']:.2f} req/s")


# ---- the whole benchmark ------------------------------------------------------------------------
def run_benchmark(cfg: BenchConfig) -> dict:
    """Every mode at every load point; writes OUT/results.json (after each mode) and the report. Returns the results."""
    from scripts.bench_report import write_report

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = model_vocab_size(cfg)
    trace = W.read_trace(cfg.trace) if cfg.trace else None
    points = load_points(cfg, trace)
    n = cfg.num_requests or (len(trace) if trace is not None else DEFAULT_NUM_REQUESTS)
    workloads = [build_requests(cfg, random.Random(f"{cfg.seed}:{i}"), n, vocab, trace) for i in range(len(points))]
    warmup = build_requests(cfg, random.Random(f"{cfg.seed}:warmup"), cfg.warmup_requests, vocab, trace)
    unloaded = build_requests(cfg, random.Random(f"{cfg.seed}:unloaded"), cfg.unloaded_requests, vocab, trace)
    modes = cfg.mode_list() or [asyncio.run(infer_mode(cfg.address))]
    results = {"config": asdict(cfg), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "workload": describe_workload(cfg, n), "address": cfg.address,
               "load_points": [p.to_json() for p in points], "runs": []}
    for mode in modes:
        address = cfg.address or f"tcp://127.0.0.1:{free_port()}"
        run = {"mode": mode, "address": address, "serve_command": None, "error": None, "warmup": None,
               "unloaded": None, "points": []}
        results["runs"].append(run)
        server = None
        try:
            if not cfg.address:
                run["serve_command"] = serve_command(cfg, mode, address)
                log.info("%s: starting %s", mode, shlex.join(run["serve_command"]))
                server = ServeProcess(run["serve_command"], out / f"serve-{mode}.log")
            asyncio.run(bench_cluster(cfg, run, server, points, workloads, warmup, unloaded))
        except ClusterError as e:
            run["error"] = str(e)
            print(f"pdcluster: error: {mode}: {e}", file=sys.stderr)
        finally:
            if server is not None:
                status = server.stop()
                log.info("%s: serve stopped (status %s)", mode, status)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    for path in write_report(out, results):
        log.info("wrote %s", path)
    print(f"results: {out / 'results.json'}\nreport: {out / 'report.md'}", flush=True)
    return results
