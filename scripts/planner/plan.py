"""A plan: for N GPUs, every prefill:decode split (and colocated replicas) simulated at each rate on the bench's
workloads (scripts/benchmark.py's `build_requests` and `arrivals`, from the same flags), scored for the
recommendation (scripts/planner/report.py).

Splits (per TP size and policy): with up to `MAX_SPLITS` of them, all; beyond, a coarse grid of that many, then
halving steps around the best until neighbours are one engine apart (the score over splits has one peak in the
cases tried; a bumpy one could hide a better split between grid points, which the output says).
"""
from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from scripts.bench_workloads import read_trace, trace_rate
from scripts.benchmark import LoadPoint, arrivals, point_requests
from scripts.planner.config import DEFAULT_REQUESTS, DEFAULT_VOCAB, MAX_JOBS, MAX_SPLITS, SLO, PlanConfig
from scripts.planner.engine import BlockPool
from scripts.planner.profile import Profile, load_profile
from scripts.planner.report import Point, score, summarize
from scripts.planner.layout import Layout
from scripts.planner.sim import ACROSS_GPUS, simulate
from scripts.planner.workload import Workload

@dataclass
class Plan:
    profiles: list[Profile]
    config: PlanConfig
    results: dict[str, list[Point]] = field(default_factory=dict)  # by layout, in the order printed
    skipped_splits: bool = False  # not every split was simulated
    spares: BlockPool = field(default_factory=BlockPool)  # block managers reused from one simulation to the next
    output_tokens: float = 0.0  # a request's streamed tokens, on average over the loads (the router's work per request)


def workloads(cfg: PlanConfig) -> list[tuple[float, Workload]]:
    """(rate, what arrives) per load point, as `pdcluster bench` would send it."""
    trace = read_trace(cfg.trace, cfg.trace_start) if cfg.trace else None
    n = cfg.num_requests or (len(trace) if trace else DEFAULT_REQUESTS)
    shared = cfg.workload == "shared-prefix"
    if trace is not None and not cfg.rates:
        points = [LoadPoint("trace", trace_rate([e.arrival for e in trace[:n]]))]
    else:
        points = [LoadPoint("rate", rate) for rate in cfg.rate_list()]
    out = []
    for i, point in enumerate(points):
        requests = point_requests(cfg, i, n, cfg.vocab_size or DEFAULT_VOCAB, trace)
        times = arrivals(cfg, point, i, requests)
        out.append((point.value, Workload(times, [r.prompt_ids for r in requests],
                                          [r.output_len for r in requests], shared)))
    return out


def evaluate(profile: Profile, layout: Layout, loads: list[tuple[float, Workload]], slo: SLO,
             spares: BlockPool | None = None) -> list[Point]:
    return [summarize(str(layout), rate, simulate(profile, layout, w, spares=spares), slo) for rate, w in loads]


# A simulating process's own: what it simulates every layout on (handed over when it is forked, not pickled: the loads
# hold every prompt's tokens), and its block managers, reused from one layout to the next. Unset in the planner's
# own process.
_worker: tuple[Profile, list[tuple[float, Workload]], SLO, BlockPool] | None = None


def _start_worker(profile: Profile, loads: list[tuple[float, Workload]], slo: SLO) -> None:
    global _worker
    _worker = (profile, loads, slo, BlockPool())


def _evaluate_in_worker(layout: Layout) -> list[Point]:
    profile, loads, slo, spares = _worker
    return evaluate(profile, layout, loads, slo, spares)


class Layouts:
    """Simulates layouts at every load: in this process, or in `jobs` forked ones at once (where the platform forks).
    A simulation is a function of its inputs, so the results are the same either way."""

    def __init__(self, jobs: int, profile: Profile, loads: list[tuple[float, Workload]], slo: SLO, spares: BlockPool):
        self.profile, self.loads, self.slo, self.spares = profile, loads, slo, spares
        self.pool = None
        if jobs > 1 and "fork" in mp.get_all_start_methods():
            self.pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_start_worker,
                                            initargs=(profile, loads, slo))

    def start(self, layouts: list[Layout]) -> list[Future]:
        if self.pool is not None:
            return [self.pool.submit(_evaluate_in_worker, layout) for layout in layouts]
        done = []
        for layout in layouts:
            done.append(Future())
            done[-1].set_result(evaluate(self.profile, layout, self.loads, self.slo, self.spares))
        return done

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def jobs(cfg: PlanConfig) -> int:
    return cfg.jobs or min(MAX_JOBS, os.cpu_count() or 1)


def run_plan(cfg: PlanConfig, profiles: list[Profile] | None = None) -> Plan:
    profiles = profiles or [load_profile(path) for path in cfg.profile_list()]
    if len({p.model for p in profiles}) > 1:
        raise ValueError(f"--profile: profiles of different models ({', '.join(p.model for p in profiles)})")
    loads, slo = workloads(cfg), cfg.slo()
    outputs = [n for _, w in loads for n in w.output_lens]
    plan = Plan(profiles, cfg, output_tokens=sum(outputs) / max(1, len(outputs)))
    for profile in profiles:
        _plan_tp(plan, profile, loads, slo)
    plan.results = dict(sorted(plan.results.items(), key=lambda item: _order(item[0])))
    plan.spares = BlockPool()  # their memory goes
    return plan


def _plan_tp(plan: Plan, profile: Profile, loads: list[tuple[float, Workload]], slo: SLO) -> None:
    """The splits (and colocated) of the GPUs into engines of the profile's TP size. The splits of each round (the
    coarse grid, then each halving step's neighbours) are simulated at once."""
    cfg, n = plan.config, plan.config.gpus // profile.tp
    if n < 2:
        raise ValueError(f"--gpus {cfg.gpus} makes fewer than 2 engines of tp {profile.tp}")
    common = dict(placement=cfg.placement, local_prefill_chunk=cfg.local_prefill_chunk, tp=profile.tp,
                  transport=ACROSS_GPUS)
    layouts = Layouts(jobs(cfg), profile, loads, slo, plan.spares)
    try:
        colocated = Layout(colocated=n, **common)
        colocated_points = layouts.start([colocated])[0]
        for policy in cfg.policy_list():
            seen: dict[int, tuple] = {}

            def best_of(xs: list[int]) -> int:
                """The best scoring split of `xs` (the first of equals), each simulated once."""
                new = [Layout(prefill=x, decode=n - x, policy=policy, **common) for x in dict.fromkeys(xs)
                       if x not in seen]
                for layout, points in zip(new, layouts.start(new)):
                    plan.results[str(layout)] = points.result()
                    seen[layout.prefill] = score(plan.results[str(layout)], slo)
                return max(xs, key=seen.__getitem__)

            if n - 1 <= MAX_SPLITS or cfg.all_splits:
                best_of(list(range(1, n)))
            else:
                plan.skipped_splits = True
                step = -(-(n - 1) // MAX_SPLITS)
                best = best_of(list(range(1, n, step)))
                while step > 1:
                    step //= 2
                    best = best_of([x for x in (best - step, best, best + step) if 1 <= x < n])
        plan.results[str(colocated)] = colocated_points.result()
    finally:
        layouts.close()


def _order(name: str) -> tuple:
    """tp, then the splits by prefill engines, then colocated."""
    tp, _, rest = name.rpartition("tp")[2].partition(" ") if name.startswith("tp") else ("1", "", name)
    if rest.startswith("colocated"):
        return (int(tp), 1, 0, rest)
    return (int(tp), 0, int(rest.split("P")[0]), rest)
