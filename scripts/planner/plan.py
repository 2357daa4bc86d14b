"""A plan: for N GPUs, every prefill:decode split (and colocated replicas) simulated at each rate on the bench's
workloads (scripts/benchmark.py's `build_requests` and `arrivals`, from the same flags), scored for the
recommendation (scripts/planner/report.py).

Splits (per TP size and policy), behind one router: with up to `MAX_SPLITS` of them, all; beyond, a coarse grid of
that many, then halving steps around the best until neighbours are one engine apart (the score over splits has one
peak in the cases tried; a bumpy one could hide a better split between grid points, which the output says). Where
the top rate needs more than one router (scripts/planner/router_ceiling.py, or --routers), each router fronts a
shard of the engines, and every split is predicted from its distinct shards, each simulated once
(scripts/planner/shards.py).
"""
from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field

from scripts.bench_workloads import BenchRequest, read_trace, trace_rate
from scripts.benchmark import LoadPoint, arrivals, point_requests
from scripts.planner.capacity import Capacity, capacity, default_rates
from scripts.planner.collector import collector_paused
from scripts.planner.config import DEFAULT_REQUESTS, DEFAULT_VOCAB, MAX_JOBS, MAX_SPLITS, SLO, PlanConfig
from scripts.planner.router_ceiling import check
from scripts.planner.shards import Outcome, mix, router_share, shards_of
from scripts.planner.block_pool import BlockPool
from scripts.planner.profile import Profile, load_profile
from scripts.planner.report import Point, score
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
    routers: dict[int, dict[str, int]] = field(default_factory=dict)  # by TP size, each mode's routers
    unsharded: dict[int, int] = field(default_factory=dict)  # by TP size, splits left out: fewer prefill or decode
    # engines than routers
    hidden: set[str] = field(default_factory=set)  # simulated but left out of the printed table (not of plan.json)
    layouts: dict[str, Layout] = field(default_factory=dict)  # each result's layout (for `redraw`)
    capacity: Capacity | None = None  # what the rates were taken from, where --rates was not given
    loads: list[tuple[float, Workload]] = field(default_factory=list)  # what was simulated (`redraw` on its seed)


def workloads(cfg: PlanConfig, first: list[BenchRequest] | None = None) -> list[tuple[float, Workload]]:
    """(rate, what arrives) per load point, as `pdcluster bench` would send it; `first`: the first point's requests,
    drawn already (`first_requests`)."""
    trace = read_trace(cfg.trace, cfg.trace_start) if cfg.trace else None
    n = cfg.num_requests or (len(trace) if trace else DEFAULT_REQUESTS)
    shared = cfg.workload == "shared-prefix"
    if trace is not None and not cfg.rates:
        points = [LoadPoint("trace", trace_rate([e.arrival for e in trace[:n]]))]
    else:
        points = [LoadPoint("rate", rate) for rate in cfg.rate_list()]
    out = []
    for i, point in enumerate(points):
        vocab = cfg.vocab_size or DEFAULT_VOCAB
        requests = first if i == 0 and first is not None else point_requests(cfg, i, n, vocab, trace, ids=False)
        times = arrivals(cfg, point, i, requests)
        given = point.kind == "trace" or bool(requests and requests[0].arrival is not None)
        cv = None if given else cfg.burstiness if cfg.arrivals == "gamma" else 1.0
        out.append((point.value, Workload(times, [r.prompt_ids for r in requests],
                                          [r.output_len for r in requests], shared, arrival_cv=cv, seed=cfg.seed)))
    return out


@collector_paused()  # until the requests are summed up: the collection that follows then scans none of them
def outcome(profile: Profile, layout: Layout, load: tuple[float, Workload], slo: SLO,
            spares: BlockPool | None = None, share: float = 1.0) -> Outcome:
    """`layout` simulated at one load, or at a router's `share` of it (a shard's)."""
    rate, w = load
    return Outcome.of(str(layout), rate, simulate(profile, layout, router_share(w, rate, share), spares=spares), slo)


# A simulating process's own: what it simulates every layout on (handed over when it is forked, not pickled: the loads
# hold every prompt's tokens), and its block managers, reused from one layout to the next. Unset in the planner's
# own process.
_worker: tuple[Profile, list[tuple[float, Workload]], SLO, BlockPool] | None = None


def _start_worker(profile: Profile, loads: list[tuple[float, Workload]], slo: SLO) -> None:
    global _worker
    _worker = (profile, loads, slo, BlockPool())


def _outcome_in_worker(layout: Layout, share: float, load: int) -> Outcome:
    profile, loads, slo, spares = _worker
    return outcome(profile, layout, loads[load], slo, spares, share)


class Layouts:
    """Simulates layouts at every load: in this process, or in `jobs` forked ones at once (where the platform forks),
    each layout at each load on its own. A simulation is a function of its inputs, so the results are the same either
    way."""

    def __init__(self, jobs: int, profile: Profile, loads: list[tuple[float, Workload]], slo: SLO, spares: BlockPool,
                 progress: Callable[[str], None] | None = None):
        self.profile, self.loads, self.slo, self.spares = profile, loads, slo, spares
        self.progress = progress
        self.started = self.finished = 0
        self.since = time.monotonic()
        self.pool = None
        if jobs > 1 and "fork" in mp.get_all_start_methods():
            self.pool = ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_start_worker,
                                            initargs=(profile, loads, slo))

    def start(self, layouts: list[Layout], shares: list[float] | None = None) -> list[list[Future]]:
        """Each layout's outcome at each load (a Future of an Outcome), at its router's share of the load."""
        shares = shares or [1.0] * len(layouts)
        self.started += len(layouts) * len(self.loads)
        started = []
        for layout, f in zip(layouts, shares):
            if self.pool is not None:
                started.append([self.pool.submit(_outcome_in_worker, layout, f, i) for i in range(len(self.loads))])
                for future in started[-1]:
                    future.add_done_callback(self._done)
                continue
            started.append([])
            for load in self.loads:
                started[-1].append(Future())
                started[-1][-1].set_result(outcome(self.profile, layout, load, self.slo, self.spares, f))
                self._done(started[-1][-1])
        return started

    def _done(self, _: Future) -> None:
        self.finished += 1
        if self.progress is not None:
            self.progress(f"simulated {self.finished} of the {self.started} layouts and rates started so far "
                          f"({time.monotonic() - self.since:.0f} s)")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def jobs(cfg: PlanConfig) -> int:
    return cfg.jobs or min(MAX_JOBS, os.cpu_count() or 1)


def run_plan(cfg: PlanConfig, profiles: list[Profile] | None = None,
             progress: Callable[[str], None] | None = None) -> Plan:
    """`progress`: told as each simulation ends (a layout, or a shard behind several routers, at every rate)."""
    profiles = profiles or [load_profile(path) for path in cfg.profile_list()]
    if len({p.model for p in profiles}) > 1:
        raise ValueError(f"--profile: profiles of different models ({', '.join(p.model for p in profiles)})")
    cap = first = None
    if not cfg.rates and not cfg.trace:
        first = first_requests(cfg)  # the rates' reckoning and the first load point draw the same
        cap = rates_for(cfg, profiles, first)
        cfg = dataclasses.replace(cfg, rates=",".join(f"{r:g}" for r in default_rates(cap)))
    loads, slo = workloads(cfg, first), cfg.slo()
    outputs = [n for _, w in loads for n in w.output_lens]
    plan = Plan(profiles, cfg, output_tokens=sum(outputs) / max(1, len(outputs)), loads=loads, capacity=cap)
    for profile in profiles:
        _plan_tp(plan, profile, loads, slo, progress)
    plan.results = dict(sorted(plan.results.items(), key=lambda item: _order(item[0])))
    plan.spares = BlockPool()  # their memory goes
    return plan


def first_requests(cfg: PlanConfig) -> list[BenchRequest]:
    """The first load point's requests, of a workload drawn (not a trace): the same whatever the rates."""
    return point_requests(cfg, 0, cfg.num_requests or DEFAULT_REQUESTS, cfg.vocab_size or DEFAULT_VOCAB, None,
                          ids=False)


def rates_for(cfg: PlanConfig, profiles: list[Profile], requests: list[BenchRequest] | None = None) -> Capacity:
    """The most the GPUs could serve of the workload's first load point's requests (`requests`, drawn already, or
    drawn here), over the profiles (TP sizes): what the rates of a plan given none are fractions of."""
    requests = requests if requests is not None else first_requests(cfg)
    prompts, outputs = [len(r.prompt_ids) for r in requests], [r.output_len for r in requests]
    return max((capacity(p, prompts, outputs, max(1, cfg.gpus // p.tp), cfg.slo().tpot) for p in profiles),
               key=lambda c: c.rate)


def _plan_tp(plan: Plan, profile: Profile, loads: list[tuple[float, Workload]], slo: SLO,
             progress: Callable[[str], None] | None = None) -> None:
    """The splits (and colocated) of the GPUs into engines of the profile's TP size, each mode behind the routers
    its top rate needs (`routers_for`)."""
    cfg, n = plan.config, plan.config.gpus // profile.tp
    if n == 1 and profile.tp == 1:
        return _plan_one_gpu(plan, profile, loads, slo, progress)
    if n < 2:
        raise ValueError(f"--gpus {cfg.gpus} makes fewer than 2 engines of tp {profile.tp}")
    common = dict(placement=cfg.placement, local_prefill_chunk=cfg.local_prefill_chunk, tp=profile.tp,
                  transport=ACROSS_GPUS)
    top = max(rate for rate, _ in loads)
    routers = {mode: routers_for(cfg, mode, n, top, plan.output_tokens) for mode in ("disagg", "colocated")}
    plan.routers[profile.tp] = routers
    shards = Shards(Layouts(jobs(cfg), profile, loads, slo, plan.spares, progress), n, loads)
    try:
        colocated = Layout(colocated=n, **common)
        colocated_shards = shards_of(colocated, routers["colocated"])
        shards.start({colocated: colocated_shards})
        for policy in cfg.policy_list():
            _plan_splits(plan, shards, routers["disagg"], dict(policy=policy, **common), slo)
        plan.results[str(colocated)] = shards.points(colocated, colocated_shards)
        plan.layouts[str(colocated)] = colocated
    finally:
        shards.layouts.close()


def _plan_one_gpu(plan: Plan, profile: Profile, loads: list[tuple[float, Workload]], slo: SLO,
                  progress: Callable[[str], None] | None = None) -> None:
    """One GPU: a colocated engine on it, or a prefill and a decode worker sharing it (`serve --gpus-per-worker
    0.5`), in turns or side by side under MPS (`--mps`, the profile's `mps` costs), each with each policy."""
    cfg = plan.config
    common = dict(placement=cfg.placement, local_prefill_chunk=cfg.local_prefill_chunk)
    plan.routers[profile.tp] = {"disagg": 1, "colocated": 1}
    shared = [Layout(prefill=1, decode=1, policy=policy, gpus_per_engine=0.5, mps=mps, **common)
              for policy in cfg.policy_list() for mps in (False, True)]
    shards = Shards(Layouts(jobs(cfg), profile, loads, slo, plan.spares, progress), 1, loads)
    try:
        layouts = {layout: shards_of(layout, 1) for layout in [*shared, Layout(colocated=1, **common)]}
        shards.start(layouts)
        for layout, counts in layouts.items():
            plan.results[str(layout)] = shards.points(layout, counts)
            plan.layouts[str(layout)] = layout
    finally:
        shards.layouts.close()


def redraw(plan: Plan, name: str, seed: int, slower: float = 0.0) -> list[Point]:
    """Layout `name` of the plan simulated again behind the same routers, on the draw of `seed` (another seed: the
    same flags, other prompts, lengths and arrival times) and on GPUs `slower` slower in every step. How far its
    figures move on another draw is the simulation's own noise at this many requests: differences between layouts
    smaller than that are the draw's. On slower GPUs, how far they move is how much they hang on the machine's pace
    (`Profile.slower`)."""
    layout = plan.layouts[name]
    profile = next(p for p in plan.profiles if p.tp == layout.tp)
    if slower:
        profile = profile.slower(slower)
    loads = plan.loads if seed == plan.config.seed else workloads(dataclasses.replace(plan.config, seed=seed))
    counts = shards_of(layout, plan.routers[layout.tp][layout.mode])
    shards = Shards(Layouts(jobs(plan.config), profile, loads, plan.config.slo(), BlockPool()),
                    plan.config.gpus // profile.tp, loads)
    try:
        shards.start({layout: counts})
        return shards.points(layout, counts)
    finally:
        shards.layouts.close()


def routers_for(cfg: PlanConfig, mode: str, engines: int, rate: float, tokens: float) -> int:
    """--routers, else the fewest whose ceilings carry `rate` (scripts/planner/router_ceiling.py); at most one per
    engine colocated, one per prefill and decode pair disaggregated. Given more than a split can serve, the splits
    are left out (as any split is that cannot give each router a prefill and a decode engine), not the plan."""
    most = engines if mode == "colocated" else engines // 2
    if cfg.routers:
        if cfg.routers > engines:
            raise ValueError(f"--routers {cfg.routers}: more than the {engines} engines (each router needs one)")
        return cfg.routers
    return min(most, check(mode, engines, rate, cfg.router_rps, tokens).routers or most)


class Shards:
    """Each distinct shard simulated once, at its share of every rate, and layouts' points mixed from them."""

    def __init__(self, layouts: Layouts, engines: int, loads: list[tuple[float, Workload]]):
        # `engines`: the plan's engines of a GPU (or of its TP size) each; a shard takes its GPUs' share of the rate
        self.layouts, self.engines, self.loads = layouts, engines, loads
        self.started: dict[Layout, list[Future]] = {}

    def start(self, splits: dict[Layout, dict[Layout, int]]) -> None:
        new = [s for s in dict.fromkeys(s for counts in splits.values() for s in counts) if s not in self.started]
        self.started.update(zip(new, self.layouts.start(new, [s.num_gpus / self.engines for s in new])))

    def points(self, layout: Layout, shards: dict[Layout, int]) -> list[Point]:
        parts = [(shard.engines * count, count, [f.result() for f in self.started[shard]])
                 for shard, count in shards.items()]
        return [mix(str(layout), rate, [(e, c, done[i]) for e, c, done in parts])
                for i, (rate, _) in enumerate(self.loads)]


def _plan_splits(plan: Plan, shards: Shards, routers: int, common: dict, slo: SLO) -> None:
    """Every split whose shards each get a prefill and a decode worker, where their distinct shards number up to
    MAX_SPLITS (or --all-splits); beyond, a coarse grid of splits, then halving steps around the best. The splits of
    each round are simulated at once. Beyond MAX_SPLITS splits shown, the printed table keeps an even grid and the
    best three (`Plan.hidden`: the others)."""
    n = shards.engines
    splits = {}
    for x in range(1, n):
        if (counts := shards_of(Layout(prefill=x, decode=n - x, **common), routers)) is not None:
            splits[x] = counts
    plan.unsharded[common["tp"]] = n - 1 - len(splits)
    seen: dict[int, tuple] = {}

    def best_of(xs: list[int]) -> int:
        """The best scoring split of `xs` (the first of equals), each simulated once."""
        new = {Layout(prefill=x, decode=n - x, **common): splits[x] for x in dict.fromkeys(xs) if x not in seen}
        shards.start(new)
        for layout, counts in new.items():
            plan.results[str(layout)] = shards.points(layout, counts)
            plan.layouts[str(layout)] = layout
            seen[layout.prefill] = score(plan.results[str(layout)], slo)
        return max(xs, key=seen.__getitem__)

    xs = sorted(splits)
    if not xs:
        return
    if len({s for counts in splits.values() for s in counts}) <= MAX_SPLITS or plan.config.all_splits:
        best_of(xs)
        if len(xs) > MAX_SPLITS and not plan.config.all_splits:
            step = -(-len(xs) // MAX_SPLITS)
            names = [str(Layout(prefill=x, decode=n - x, **common)) for x in xs]
            best = sorted(names, key=lambda name: score(plan.results[name], slo), reverse=True)[:3]
            plan.hidden.update(set(names) - set(names[::step]) - set(best))
    else:
        plan.skipped_splits = True
        step = -(-len(xs) // MAX_SPLITS)
        best = best_of(xs[::step])
        while step > 1:
            step //= 2
            best = best_of([x for x in (best - step, best, best + step) if x in splits])


def _order(name: str) -> tuple:
    """tp, then the splits by prefill engines, then colocated."""
    tp, _, rest = name.rpartition("tp")[2].partition(" ") if name.startswith("tp") else ("1", "", name)
    if rest.startswith("colocated"):
        return (int(tp), 1, 0, rest)
    return (int(tp), 0, int(rest.split("P")[0]), rest)
