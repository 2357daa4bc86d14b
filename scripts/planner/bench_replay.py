"""A `pdcluster bench` run rebuilt for the simulator (`pdcluster plan --validate`): its settings, each mode's cluster
and KV transport, each load point's requests (by the bench's own builders, checked against its records) at the times
the bench sent them, and the run as the bench served it, phase by phase."""
from __future__ import annotations

import dataclasses
import json
import random
from dataclasses import dataclass
from pathlib import Path

from router.config import RouterConfig
from scripts.bench_config import DEFAULT_NUM_REQUESTS, POLICY_VARIANTS, BenchConfig, mode_variants
from scripts.bench_hardware import tensor_parallel_size, uses_mps
from scripts.bench_metrics import RequestRecord
from scripts.bench_workloads import read_trace
from scripts.benchmark import build_requests, point_requests
from scripts.planner.config import DEFAULT_VOCAB
from scripts.planner.layout import Layout
from scripts.planner.profile import Profile
from scripts.planner.workload import Workload


class ValidationError(ValueError):
    """Results that cannot be replayed: the message says what is missing or does not match."""


def bench_config(results: dict) -> BenchConfig:
    """The run's settings (fields unknown to this version dropped, missing ones at their defaults)."""
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig(**{k: v for k, v in results["config"].items() if k in known})


def vocab_size(results: dict, cfg: BenchConfig) -> int:
    """The vocabulary the prompts were drawn from: recorded, given, or the model's (results from before it was
    recorded); else Qwen3's."""
    if results.get("vocab_size"):
        return results["vocab_size"]
    if cfg.vocab_size:
        return cfg.vocab_size
    try:
        return int(json.loads((Path(cfg.model or "") / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_VOCAB


def layout_of(run: dict, cfg: BenchConfig, profile: Profile) -> Layout:
    """The cluster one mode ran, as the simulator's layout."""
    base, variants = mode_variants(run["mode"])
    router = RouterConfig(model="simulated", mode=base)
    policy = next((v for v in variants if v in POLICY_VARIANTS), router.disagg_policy)
    placement = next((v for v in variants if v not in POLICY_VARIANTS), router.placement)
    hw = run.get("hardware")
    tp = tensor_parallel_size(cfg.serve_args)
    if tp != profile.tp:
        raise ValidationError(f"{run['mode']}: the bench ran TP {tp}, the profile is of TP {profile.tp}")
    if base == "disagg":
        workers = hw["workers"] if hw else {"prefill": cfg.prefill_workers, "decode": cfg.decode_workers}
        per = cfg.gpus_per_worker
        counts = dict(prefill=workers["prefill"], decode=workers["decode"])
    else:
        workers = hw["workers"] if hw else {"colocated": cfg.workers}
        per = cfg.colocated_gpus_per_worker or cfg.gpus_per_worker
        counts = dict(colocated=workers["colocated"])
    if hw and hw.get("device") == "cuda":
        per = hw["gpus_per_worker"] / tp
    elif hw and hw.get("device") == "cpu":
        per = 1.0  # CPU workers split the cores: a CPU profile measured one worker's share
    return Layout(**counts, policy=policy, placement=placement, local_prefill_chunk=router.local_prefill_chunk,
                  tp=tp, gpus_per_engine=per, mps=per < 1 and uses_mps(cfg.serve_args))


def run_transport(run: dict) -> str | None:
    """The KV transport most of the run's handoffs took, as its prefill workers recorded them (None: no handoffs,
    or results from before they were recorded)."""
    counts: dict[str, int] = {}
    for measured in run["points"]:
        for engine in measured.get("engines") or []:
            for transport, h in (engine.get("handoffs") or {}).items():
                counts[transport] = counts.get(transport, 0) + h["count"]
    return max(counts, key=counts.get) if counts else None


def with_transport(layout: Layout, run: dict, profile: Profile) -> tuple[Layout, str]:
    """The layout with its handoffs over the transport the run used, and a note where the profile has no cost for
    it (then the profile's fastest stands in)."""
    used = run_transport(run)
    if used is None:
        return layout, ""
    layout = dataclasses.replace(layout, transport=used)
    if (stand_in := profile.cost_transport(used)) == used:
        return layout, ""
    return layout, (f"{run['mode']}: the run's KV handoffs went over {used}, which the profile has no cost for (it "
                    f"has {', '.join(profile.handoff)}; `pdcluster profile` measures nccl on two GPUs): costed as "
                    f"{stand_in}")


def run_trace(cfg: BenchConfig) -> list | None:
    """The trace a trace run replayed (from where it started), as the bench read it; None for other workloads."""
    return read_trace(cfg.trace, cfg.trace_start) if cfg.trace else None


def workload_of(results: dict, cfg: BenchConfig, index: int, records: list[RequestRecord]) -> Workload:
    """Load point `index`'s requests, rebuilt as the bench built them, sent when the bench sent them (in the
    order built: the bench sends them in that order)."""
    trace = run_trace(cfg)
    n = cfg.num_requests or (len(trace) if trace is not None else DEFAULT_NUM_REQUESTS)
    requests = point_requests(cfg, index, n, vocab_size(results, cfg), trace)
    records = sorted(records, key=lambda r: r.index)
    if [(len(r.prompt_ids), r.output_len) for r in requests] != [(r.prompt_len, r.output_len) for r in records]:
        raise ValidationError(f"load point {index}: the rebuilt requests differ from the recorded ones (prompt "
                              "and output lengths): another vocabulary size or trace than the run's?")
    return Workload([r.start for r in records], [r.prompt_ids for r in requests], [r.output_len for r in requests],
                    cfg.workload == "shared-prefix")


@dataclass
class Served:
    """A mode's run as the bench served it (scripts/benchmark.py, `bench_cluster`): one cluster through its warm-up,
    its unloaded requests one at a time, then its load points, each phase begun once the one before has finished.
    Simulated as one run, what the cluster learns in one phase (the router's per-request policy, the prefix caches)
    carries into the next, as it did when served."""

    workload: Workload
    unloaded: list[RequestRecord]  # measured, one a phase after the warm-up's
    first_point: int  # the phase of the first load point


def served(results: dict, run: dict, cfg: BenchConfig, points: list[Workload]) -> Served:
    """The run's phases, rebuilt by the bench's builders: the warm-up (all at once), each unloaded request, each
    load point at its send times (a phase of none where the run recorded no warm-up)."""
    unloaded = sorted((RequestRecord.from_json(r) for r in (run.get("unloaded") or {}).get("requests", [])),
                      key=lambda r: r.index)
    vocab, trace = vocab_size(results, cfg), run_trace(cfg)
    warm = (run.get("warmup") or {}).get("requests", 0)
    before = build_requests(cfg, random.Random(f"{cfg.seed}:warmup"), warm, vocab, trace) if warm else []
    if unloaded:
        alone = build_requests(cfg, random.Random(f"{cfg.seed}:unloaded"), cfg.unloaded_requests, vocab, trace)
        if [len(r.prompt_ids) for r in alone][:len(unloaded)] != [r.prompt_len for r in unloaded]:
            raise ValidationError("the unloaded requests differ from the recorded ones (prompt lengths)")
        before += alone[:len(unloaded)]
    phases = [warm] + [1] * len(unloaded) + [len(w.arrivals) for w in points]
    workload = Workload([0.0] * len(before) + [t for w in points for t in w.arrivals],
                        [r.prompt_ids for r in before] + [p for w in points for p in w.prompts],
                        [r.output_len for r in before] + [n for w in points for n in w.output_lens],
                        any(w.shared_prefixes for w in points), phases=phases)
    return Served(workload, unloaded, len(phases) - len(points))
