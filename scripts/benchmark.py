"""Serving benchmark: disaggregated vs colocated clusters under the same load, measured at the client.

    pdcluster bench --model DIR --modes disagg,colocated --rates 1,2,4,8 --out OUT      # open loop, Poisson
    pdcluster bench --model DIR --concurrency 1,8,32 --out OUT                          # closed loop
    pdcluster bench --model DIR --rates 2,4 --arrivals gamma --burstiness 3 --out OUT   # bursty open loop
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
output_len; replayed as recorded, or scaled to each of --rates). With --prefix-cache-tokens (one prefill worker's
KV cache, in tokens), shared-prefix picks as many system prompts as fill all the prefill workers' caches together
but not one: the workload where prefix-aware placement pays. A mode may name a variant (--modes
disagg:prefix,disagg:load compares the router's placements on the same load).

Fair comparisons use the same hardware for both modes:

    # 2 GPUs: 1 prefill + 1 decode worker vs 2 colocated replicas, a GPU each
    pdcluster bench --model DIR --device cuda --prefill-workers 1 --decode-workers 1 --workers 2 \\
        --gpus-per-worker 1 --rates 2,4,8,16 --out OUT
    # 1 GPU: prefill and decode share it (half its memory each) vs one colocated replica on all of it
    pdcluster bench --model DIR --device cuda --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 \\
        --workers 1 --colocated-gpus-per-worker 1 --rates 2,4,8,16 --out OUT
    # CPU: the cores are split among the workers; --workers 2 gives colocated as many engines as 1P+1D
    pdcluster bench --model DIR --device cpu --workers 2 --rates 1,2 --out OUT

The report states each mode's hardware and whether the modes had equal hardware, and the SLO with its source
(--slo-ttft/--slo-tpot; else 1 s / 50 ms on GPUs, --slo-scale x the unloaded p50 on CPU).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from common.sampling_params import InvalidRequest
from common.stalls import Stalls
from scripts import bench_workloads as W
from scripts.bench_config import DEFAULT_NUM_REQUESTS, BenchConfig
from scripts.bench_hardware import machine, mode_hardware
from scripts.bench_metrics import SLO, RequestRecord, summarize
from scripts.bench_server import (ClusterError, ServeProcess, engine_activity, engine_totals, free_port, infer_mode,
                                  router_activity,
                                  serve_command, wait_ready, watch)
from scripts.bench_slo import known_before, rejudge, settle
from scripts.bench_workloads import BenchRequest, TraceEntry

log = logging.getLogger("pdcluster.bench")


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
# The client's CPU over a load point's wall time from which its note says so: the old client was this busy at the
# 32 req/s where it first added milliseconds to a first token (docs/benchmarks.md, stop 35)
CLIENT_BUSY = 0.5


def load_points(cfg: BenchConfig, trace: list[TraceEntry] | None) -> list[LoadPoint]:
    if cfg.concurrency:
        return [LoadPoint("concurrency", c) for c in cfg.concurrency_list()]
    if trace is not None and not cfg.rates:
        return [LoadPoint("trace", W.trace_rate([e.arrival for e in trace]))]
    return [LoadPoint("rate", r) for r in cfg.rate_list()]


def build_requests(cfg: BenchConfig, rng: random.Random, n: int, vocab: int,
                   trace: list[TraceEntry] | None, ids: bool = True) -> list[BenchRequest]:
    """Without `ids`, prompts that share no block hold stand-in ids (bench_workloads.random_prompt); shared
    prefixes keep theirs."""
    if trace is not None:
        return W.trace_requests(rng, trace[:n], vocab, ids)
    ins, outs = cfg.lengths("input_len"), cfg.lengths("output_len")
    if cfg.workload == "long-short":
        return W.long_short_mix(rng, n, vocab, ins, outs, cfg.lengths("long_input_len"),
                                cfg.lengths("long_output_len"), cfg.long_fraction, ids)
    if cfg.workload == "shared-prefix":
        return W.shared_prefix_mix(rng, n, vocab, cfg.prefix_len, cfg.prefix_count(), ins, outs)
    return W.random_requests(rng, n, vocab, ins, outs, ids)


def point_requests(cfg: BenchConfig, index: int, n: int, vocab: int,
                   trace: list[TraceEntry] | None, ids: bool = True) -> list[BenchRequest]:
    """Load point `index`'s requests, from a seed of their own (`pdcluster plan` and `plan --validate` draw the
    same, without `ids`: build_requests)."""
    return build_requests(cfg, random.Random(f"{cfg.seed}:{index}"), n, vocab, trace, ids)


def arrivals(cfg: BenchConfig, point: LoadPoint, index: int, requests: list[BenchRequest]) -> list[float]:
    """When each request of an open-loop point is sent, in seconds after the point's start."""
    if point.kind == "trace":
        return [r.arrival for r in requests]
    if requests and requests[0].arrival is not None:
        return W.scale_arrivals([r.arrival for r in requests], point.value)
    rng = random.Random(f"{cfg.seed}:{index}:arrivals")
    if cfg.arrivals == "gamma":
        return W.gamma_arrivals(rng, len(requests), point.value, cfg.burstiness)
    return W.poisson_arrivals(rng, len(requests), point.value)


def describe_workload(cfg: BenchConfig, n: int) -> str:
    io = f"input {cfg.input_len}, output {cfg.output_len} tokens"
    if cfg.workload == "trace":
        start = f" from {cfg.trace_start:g} s in" if cfg.trace_start else ""
        return f"trace {cfg.trace}{start} ({n} requests per load point)"
    if cfg.workload == "long-short":
        io = (f"{100 * cfg.long_fraction:g}% long (input {cfg.long_input_len}, output {cfg.long_output_len}), "
              f"the others {io}")
    elif cfg.workload == "shared-prefix":
        io = f"one of {cfg.prefix_count()} system prompts of {cfg.prefix_len} tokens + {io}"
    arrive = f"; gamma arrivals, CV {cfg.burstiness:g}" if cfg.arrivals == "gamma" and not cfg.concurrency else ""
    return f"{cfg.workload}: {io}; {n} requests per load point{arrive}"


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
        timings = stream.result.timings
        rec.router_queued, rec.router_ttft, rec.router_reserved = timings.queued, timings.ttft, timings.reserved
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


async def bench_cluster(cfg: BenchConfig, run: dict, server: ServeProcess | None, points: list[LoadPoint],
                        workloads: list[list[BenchRequest]], warmup: list[BenchRequest],
                        unloaded: list[BenchRequest], slo: SLO | None = None) -> None:
    """Warm up one cluster, serve the unloaded requests one at a time, then run every load point on it.

    Results go into `run` as they come, goodput judged by `slo` (None: not known yet, judged later by rejudge).
    """
    from tqdm import tqdm

    from router.client import AsyncClient

    mode = run["mode"]

    def alive() -> bool:
        return server is None or server.exited() is None

    async def measure(label: str, point: LoadPoint, requests: list[BenchRequest], times: list[float] | None) -> dict:
        before = await engine_totals(client)
        # this process's own stalls: they would count as the cluster's
        async with Stalls().watching() as stalls:
            with tqdm(total=len(requests), desc=f"{mode} {label}", file=sys.stderr, dynamic_ncols=True) as bar:
                records = await run_point(client, point, requests, times, cfg.request_timeout, bar, alive)
        result = {"load": point.to_json(), "summary": asdict(summarize(records, slo or SLO(math.inf, math.inf))),
                  "requests": [r.to_json() for r in records],
                  "engines": engine_activity(before, after := await engine_totals(client)),
                  "router": router_activity(before, after),
                  "client": stalls.totals()}
        print(summary_line(mode, label, result["summary"], judged=slo is not None) + stall_note(result), flush=True)
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


def summary_line(mode: str, label: str, s: dict, judged: bool = True) -> str:
    def ms(d: dict, stat: str) -> str:
        return "n/a" if d[stat] is None else f"{d[stat] * 1e3:.1f}"

    return (f"{mode:<10} {label:<22} {s['completed']}/{s['requests']} ok"
            f"  ttft p50/p99 {ms(s['ttft'], 'p50')}/{ms(s['ttft'], 'p99')} ms"
            f"  tpot p50/p99 {ms(s['tpot'], 'p50')}/{ms(s['tpot'], 'p99')} ms"
            f"  {s['output_throughput']:.1f} tok/s  goodput "
            + (f"{s['goodput']:.2f} req/s" if judged else "at the end (SLO from the unloaded requests)"))


def stall_note(result: dict) -> str:
    """The bench client's and the router's own stalls over a point, where there were any, and a client busy
    `CLIENT_BUSY` of its core or more: the latencies measured then include them (a busy client's loop queues the
    tokens it reads: stop 35)."""
    parts = []
    for who in ("client", "router"):
        s = result.get(who) or {}
        if s.get("loop_stalls") or s.get("gc_pauses"):
            parts.append(f"{who} {s['loop_stalls']} loop stalls ({s['loop_stall_seconds']:.2f} s), "
                         f"{s['gc_pauses']} full GCs ({s['gc_seconds']:.2f} s)")
    busy = (result.get("client") or {}).get("cpu_busy", 0.0)
    if busy >= CLIENT_BUSY:
        parts.append(f"client busy {100 * busy:.0f}% of a core")
    return "  stalls: " + "; ".join(parts) if parts else ""


# ---- the whole benchmark ------------------------------------------------------------------------
def run_benchmark(cfg: BenchConfig) -> dict:
    """Every mode at every load point; writes OUT/results.json (after each mode) and the report. Returns the results."""
    from scripts.bench_report import write_report

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = model_vocab_size(cfg)
    trace = W.read_trace(cfg.trace, cfg.trace_start) if cfg.trace else None
    points = load_points(cfg, trace)
    n = cfg.num_requests or (len(trace) if trace is not None else DEFAULT_NUM_REQUESTS)
    workloads = [point_requests(cfg, i, n, vocab, trace) for i in range(len(points))]
    warmup = build_requests(cfg, random.Random(f"{cfg.seed}:warmup"), cfg.warmup_requests, vocab, trace)
    unloaded = build_requests(cfg, random.Random(f"{cfg.seed}:unloaded"), cfg.unloaded_requests, vocab, trace)
    modes = cfg.mode_list() or [asyncio.run(infer_mode(cfg.address))]
    hw = machine(cfg)
    results = {"config": asdict(cfg), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "workload": describe_workload(cfg, n), "vocab_size": vocab, "address": cfg.address, "machine": hw,
               "slo": None,
               "load_points": [p.to_json() for p in points], "runs": []}
    for mode in modes:
        address = cfg.address or f"tcp://127.0.0.1:{free_port()}"
        run = {"mode": mode, "address": address, "serve_command": None, "hardware": mode_hardware(cfg, mode, hw),
               "error": None, "warmup": None, "unloaded": None, "points": []}
        results["runs"].append(run)
        server = None
        try:
            if not cfg.address:
                run["serve_command"] = serve_command(cfg, mode, address, hw["device"])
                log.info("%s: starting %s", mode, shlex.join(run["serve_command"]))
                server = ServeProcess(run["serve_command"], out / f"serve-{mode}.log")
            asyncio.run(bench_cluster(cfg, run, server, points, workloads, warmup, unloaded,
                                      slo=known_before(cfg, hw["device"])))
        except ClusterError as e:
            run["error"] = str(e)
            print(f"pdcluster: error: {mode}: {e}", file=sys.stderr)
        finally:
            if server is not None:
                status = server.stop()
                log.info("%s: serve stopped (status %s)", mode, status)
            results["slo"] = settle(cfg, hw["device"], results["runs"])  # so far: the modes run until now
            rejudge(results, results["slo"])
            (out / "results.json").write_text(json.dumps(results, indent=1))
    slo = results["slo"]
    print(f"SLO: TTFT <= {slo['ttft'] * 1e3:.1f} ms ({slo['ttft_from']}); "
          f"TPOT <= {slo['tpot'] * 1e3:.1f} ms ({slo['tpot_from']})", flush=True)
    for path in write_report(out, results):
        log.info("wrote %s", path)
    print(f"results: {out / 'results.json'}\nreport: {out / 'report.md'}", flush=True)
    return results
