"""`pdcluster bench`'s settings: one dataclass whose fields are the command's flags (scripts/cli/bench.py makes
them with add_dataclass_args), checked as a whole when made."""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from scripts.bench_workloads import ARRIVALS, LengthRange, prefixes_to_fill

MODES = ("disagg", "colocated")
# A mode may name variants after a colon, joined by `+`: the router's placement (`disagg:load` places prefills by
# load alone, the baseline of prefix-aware placement, `prefix`) and, disaggregated, where each prompt is prefilled
# (`disagg:auto`, `disagg:never`, `disagg:always`: --disagg-policy), e.g. `disagg:auto+load`.
PLACEMENT_VARIANTS, POLICY_VARIANTS = ("prefix", "load"), ("always", "never", "auto")
VARIANTS = {**{v: ["--placement", v] for v in PLACEMENT_VARIANTS},
            **{v: ["--disagg-policy", v] for v in POLICY_VARIANTS}}


def mode_variants(mode: str) -> tuple[str, list[str]]:
    """`disagg:auto+load` -> ("disagg", ["auto", "load"])."""
    base, _, variants = mode.partition(":")
    return base, [v for v in variants.split("+") if v] if variants else []

DEVICES = ("auto", "cpu", "cuda")
WORKLOADS = ("random", "long-short", "shared-prefix", "trace")
DEFAULT_RATES = "1,2,4,8"
DEFAULT_NUM_REQUESTS = 100


def _opt(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class BenchConfig:
    out: str = field(metadata={"help": "folder for results.json, report.md, the plots and the serve logs"})
    model: str | None = _opt(None, "checkpoint folder: what the started clusters serve; its config gives the "
                                   "vocabulary size")
    address: str | None = _opt(None, "benchmark the cluster running at this router address instead of "
                                     "starting one per mode")
    modes: str | None = _opt(None, "comma list of disagg, colocated, each with variants after a colon if "
                                   "wanted, joined by +: prefix or load (placement), always, never or auto "
                                   "(disagg: --disagg-policy), e.g. disagg:always,disagg:auto,colocated "
                                   "(default: disagg,colocated; with --address: the running cluster's)")
    rates: str | None = _opt(None, f"comma list of Poisson arrival rates, requests/s; inf = all at once "
                                   f"(default: {DEFAULT_RATES})")
    concurrency: str | None = _opt(None, "comma list of closed-loop concurrencies, instead of --rates")
    arrivals: str = _opt("poisson", "open loop: poisson, or gamma (gaps with coefficient of variation --burstiness)")
    burstiness: float = _opt(1.0, "gamma arrivals: coefficient of variation of the gaps between requests (1: as "
                                  "Poisson; 2-4: bursts and lulls)")
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
    prefix_cache_tokens: int | None = _opt(None, "shared-prefix: the prefix cache (KV tokens) of one prefill worker "
                                                 "(colocated: replica); given, --num-prefixes is chosen so that the "
                                                 "prefixes fit in all their caches together but not in one")
    trace: str | None = _opt(None, "trace workload: JSON lines {\"arrival\": s, \"input_len\": n, "
                                   "\"output_len\": n}, or a CSV of Azure's public LLM inference traces "
                                   "(TIMESTAMP,ContextTokens,GeneratedTokens); several joined by commas merge "
                                   "into one (e.g. the code and conversation traces: a bursty chat/coding mix)")
    trace_start: float = _opt(0.0, "trace workload: replay from this many seconds into the trace")
    slo_ttft: float | None = _opt(None, "SLO on time to first token, seconds (default: 1.0 on GPUs; on CPU "
                                        "--slo-scale x the unloaded TTFT p50)")
    slo_tpot: float | None = _opt(None, "SLO on time per output token after the first, seconds (default: 0.05 "
                                        "on GPUs; on CPU --slo-scale x the unloaded TPOT p50)")
    slo_scale: float = _opt(5.0, "on CPU, without --slo-ttft/--slo-tpot: each SLO is this multiple of the slower "
                                 "mode's unloaded p50")
    tpot_ratio_target: float = _opt(1.2, "the report's SLO reading: is disagg's TPOT p90 within this multiple "
                                         "of its unloaded TPOT p50 where colocated breaks the TPOT SLO? (this "
                                         "project's design goal for decode stability under load)")
    seed: int = _opt(0, "seed of prompts, lengths and arrival times")
    vocab_size: int | None = _opt(None, "prompt token ids are below this (default: the model's vocab_size)")
    request_timeout: float = _opt(600.0, "seconds one request may take before it counts as failed")
    ready_timeout: float = _opt(900.0, "seconds a started cluster may take to become ready")
    device: str = _opt("auto", "serve: cpu, cuda or auto (GPUs if nvidia-smi finds any); with --address, what "
                               "the running cluster runs on, for the report and the SLO defaults")
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
            base, variants = mode_variants(mode)
            policies = [v for v in variants if v in POLICY_VARIANTS]
            placements = [v for v in variants if v in PLACEMENT_VARIANTS]
            if (base not in MODES or len(policies) + len(placements) < len(variants) or len(policies) > 1
                    or len(placements) > 1 or (policies and base != "disagg")):
                raise ValueError(f"--modes: expected disagg and/or colocated, each maybe with :VARIANT[+VARIANT] "
                                 f"(a placement: prefix, load; disagg: always, never, auto), got {mode!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"--arrivals: expected one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if not self.burstiness > 0 or not math.isfinite(self.burstiness):
            raise ValueError(f"--burstiness: must be a finite number > 0, got {self.burstiness:g}")
        if self.rates and self.concurrency:
            raise ValueError("bench: give --rates (open loop) or --concurrency (closed loop), not both")
        self.rate_list()
        self.concurrency_list()
        if self.device not in DEVICES:
            raise ValueError(f"--device: expected one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"--workload: expected one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if (self.workload == "trace") != (self.trace is not None):
            raise ValueError("bench: --trace FILE goes with --workload trace, and only with it")
        if not (math.isfinite(self.trace_start) and self.trace_start >= 0) or (self.trace_start and not self.trace):
            raise ValueError(f"--trace-start: seconds >= 0 into a --trace, got {self.trace_start:g}")
        for name in ("input_len", "output_len", "long_input_len", "long_output_len"):
            self.lengths(name)
        if not 0 <= self.long_fraction <= 1:
            raise ValueError(f"--long-fraction: must be in [0, 1], got {self.long_fraction:g}")
        positive = ("prefix_len", "num_prefixes", "prefix_cache_tokens", "num_requests", "prefill_workers",
                    "decode_workers", "workers", "vocab_size", "slo_ttft", "slo_tpot", "slo_scale", "tpot_ratio_target",
                    "request_timeout", "ready_timeout", "gpus_per_worker", "colocated_gpus_per_worker")
        for name in positive:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be > 0, got {value:g}")
        for name in ("warmup_requests", "unloaded_requests"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(self, name)}")
        if self.prefix_cache_tokens is not None:
            try:
                self.prefix_count()
            except ValueError as e:
                raise ValueError(f"--prefix-cache-tokens: {e}") from None
        try:
            shlex.split(self.serve_args)
        except ValueError as e:
            raise ValueError(f"--serve-args: {e}") from None

    def mode_list(self) -> list[str]:
        modes = [m.strip() for m in (self.modes or ("" if self.address else ",".join(MODES))).split(",") if m.strip()]
        if len(set(modes)) != len(modes):
            raise ValueError(f"--modes: a mode is named twice in {self.modes!r}")
        return modes

    def prefix_count(self) -> int:
        """shared-prefix: distinct system prompts; with --prefix-cache-tokens, as many as fill the caches of the
        prefill workers (colocated replicas, when no disagg mode runs) together but do not fit in one."""
        if self.prefix_cache_tokens is None:
            return self.num_prefixes
        disagg = any(mode_variants(m)[0] == "disagg" for m in self.mode_list()) or not self.mode_list()
        workers = self.prefill_workers if disagg else self.workers
        return prefixes_to_fill(self.prefix_cache_tokens, workers, self.prefix_len)

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
