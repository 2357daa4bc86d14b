"""`pdcluster plan`'s settings: the bench's workload flags (BenchConfig's fields, less those that only a real
cluster has) and the planner's own, checked when made; and the SLO the layouts are judged by. Light: the command
line imports it to make its flags, and the simulator only when a plan runs."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from scripts.bench_metrics import SLO  # noqa: F401  (the bench's: one judge for both)
from scripts.bench_config import PLACEMENT_VARIANTS, POLICY_VARIANTS, WORKLOADS, BenchConfig, _opt
from scripts.bench_workloads import ARRIVALS

MAX_SPLITS = 16
MAX_JOBS = 8  # processes a plan uses by default: each holds its own simulated engines' block managers
DEFAULT_VOCAB = 151936
DEFAULT_REQUESTS = 1000
# How much slower than its profile a machine of the kind may run (measured in docs/planner.md, "One kind, many
# machines")
SLOWER_GPUS = 0.04
VALIDATE_FLAGS = ("validate", "profile", "out", "tolerance", "slower_gpus")  # the flags --validate reads
# BenchConfig's flags that say nothing about a simulated cluster's load
BENCH_ONLY = ("model", "address", "modes", "concurrency", "warmup_requests", "unloaded_requests", "slo_scale",
              "tpot_ratio_target", "request_timeout", "ready_timeout", "device", "prefill_workers",
              "decode_workers", "workers", "gpus_per_worker", "colocated_gpus_per_worker", "serve_args",
              "prefix_cache_tokens")


@dataclass
class PlanConfig(BenchConfig):
    """The bench's workload flags (BenchConfig's fields less BENCH_ONLY) and the planner's own."""

    out: str | None = _opt(None, "folder for plan.json and the plots (default: print only)")
    # The bench's fields whose help or default differ here (same names, same parsing)
    rates: str | None = _opt(None, "comma list of arrival rates to simulate, requests/s, for the whole cluster "
                                   "(default: four, from half to 1.25 times what the GPUs could serve at most, "
                                   "reckoned from the profile; a trace without it: as recorded)")
    num_requests: int | None = _opt(None, f"requests per rate (default: {DEFAULT_REQUESTS}; a trace's: all its "
                                          "lines)")
    slo_ttft: float | None = _opt(None, "SLO on time to first token, seconds (default: 1.0)")
    slo_tpot: float | None = _opt(None, "SLO on time per output token after the first, seconds (default: 0.05)")
    vocab_size: int | None = _opt(None, f"prompt token ids are below this (default: {DEFAULT_VOCAB}); only "
                                        "prefix sharing depends on them")
    profile: str = _opt("", "cost profile JSON (`pdcluster profile`; examples in scripts/planner/profiles/); a "
                            "comma list of profiles of one model at several TP sizes compares them too")
    gpus: int = _opt(8, "GPUs to split between prefill and decode (each split xP:yD, x + y = GPUS, and GPUS "
                        "colocated replicas; 1: a colocated engine, or 1P:1D sharing the GPU)")
    disagg_policies: str = _opt("always,auto", "comma list of --disagg-policy values to simulate for each "
                                               "split (always, never, auto: the router's per-request choice)")
    placement: str = _opt("prefix", "the router's placement: prefix or load")
    local_prefill_chunk: int = _opt(512, "decode workers' prefill chunk (prompts they prefill themselves)")
    all_splits: bool = _opt(False, f"simulate every split even beyond {MAX_SPLITS}")
    jobs: int = _opt(0, f"layouts simulated at once, each in a process of its own (0: this machine's cores, at most "
                        f"{MAX_JOBS}; 1: one after another in this process); the plan is the same either way")
    validate: str | None = _opt(None, "a `pdcluster bench` results.json, or a comma list of one machine's: simulate "
                                      "their modes on their requests at their send times and print predicted / "
                                      "measured (error) beside each other, instead of a plan (the workload, rates "
                                      "and layouts come from the results; a path no unloaded request of a mode took "
                                      "gets the other modes' offset on it)")
    tolerance: float = _opt(0.15, "--validate: errors beyond this share of the measurement are marked")
    slower_gpus: float = _opt(SLOWER_GPUS, "the recommended layout simulated again on GPUs this share slower in "
                                           "every step (machines of one kind differ by a few percent), and how far "
                                           "its figures move printed; with --validate, each missed latency cell "
                                           "predicted again on GPUs this share slower (or faster); 0: not")
    routers: int = _opt(0, "routers, each in front of its own shard of the engines with its share of the clients "
                           "(0: as many as the top rate needs, from --router-rps or the measured ceiling; 1: one "
                           "router in front of every engine, simulated whole, however slowly)")
    router_rps: float | None = _opt(None, "requests/s one router sustains (default: what scripts/bench_router.py "
                                          "measured for that many workers, scripts/planner/router_ceiling.py); a "
                                          "rate beyond it is reported with the routers it needs")

    def __post_init__(self) -> None:
        if not self.profile:
            raise ValueError("plan: --profile FILE is required")
        if self.validate:
            given = [f.name for f in dataclasses.fields(self) if f.name not in VALIDATE_FLAGS and f.init
                     and getattr(self, f.name) != f.default]
            if given:
                raise ValueError(f"plan --validate takes the workload, rates and layouts from the results: drop "
                                 f"--{given[0].replace('_', '-')}")
            if "," in self.profile:
                raise ValueError("plan --validate: one --profile")
        if not 0 < self.tolerance:
            raise ValueError(f"--tolerance: must be > 0, got {self.tolerance}")
        if self.gpus < 1:
            raise ValueError(f"--gpus: must be >= 1, got {self.gpus}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"--workload: expected one of {', '.join(WORKLOADS)}, got {self.workload!r}")
        if self.arrivals not in ARRIVALS:
            raise ValueError(f"--arrivals: expected one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if self.placement not in PLACEMENT_VARIANTS:
            raise ValueError(f"--placement: expected one of {', '.join(PLACEMENT_VARIANTS)}, got {self.placement!r}")
        if self.workload == "trace" and not self.trace:
            raise ValueError("plan: --trace FILE goes with --workload trace")
        if self.trace:
            self.workload = "trace"
        for name in ("input_len", "output_len", "long_input_len", "long_output_len"):
            self.lengths(name)
        self.rate_list()
        for policy in self.policy_list():
            if policy not in POLICY_VARIANTS:
                raise ValueError(f"--disagg-policies: expected always, never or auto, got {policy!r}")
        if not 0 <= self.slower_gpus < 1:
            raise ValueError(f"--slower-gpus: a share from 0 to below 1, got {self.slower_gpus}")
        if self.jobs < 0:
            raise ValueError(f"--jobs: must be >= 0, got {self.jobs}")
        if self.routers < 0:
            raise ValueError(f"--routers: must be >= 0, got {self.routers}")
        for name in ("slo_ttft", "slo_tpot", "num_requests", "local_prefill_chunk", "vocab_size", "burstiness",
                     "router_rps"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be > 0, got {value}")

    def profile_list(self) -> list[str]:
        return [p.strip() for p in self.profile.split(",") if p.strip()]

    def policy_list(self) -> list[str]:
        return [p.strip() for p in self.disagg_policies.split(",") if p.strip()]

    def slo(self) -> SLO:
        return SLO(self.slo_ttft or 1.0, self.slo_tpot or 0.05)
