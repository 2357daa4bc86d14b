"""A cluster behind several routers: each router in front of its own shard of the workers (its own prefill and
decode pools, or its own replicas), the clients split across the routers by shard size, as the router ceiling
advises once one router cannot carry the rate (scripts/planner/router_ceiling.py).

Shards share nothing, so a layout's prediction is its shards': each distinct shard is simulated once, alone, on its
router's share of the clients' requests (`router_share`: a random split, shard engines / engines of the stream; as many
requests as the workload's, except from a trace, whose requests a router gets its share of), and the layout's figures
are its shards' mixed by their share of the traffic. Splits of many GPUs repeat the same few shards (a shard of six
engines is 1P:5D to 5P:1D), so every split of hundreds of GPUs costs a few small simulations a rate.
"""
from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import operator
import random
from collections.abc import Callable
from dataclasses import dataclass

from scripts.bench_metrics import SLO, percentile
from scripts.planner.layout import Layout
from scripts.planner.report import Point, records, summarize
from scripts.planner.workload import SimRequest, Workload


def shard_sizes(engines: int, routers: int) -> list[int]:
    """Engines behind each router, as even as they go (the larger shards first)."""
    base, extra = divmod(engines, routers)
    return [base + (i < extra) for i in range(routers)]


def shards_of(layout: Layout, routers: int) -> dict[Layout, int] | None:
    """The distinct shards of `layout` behind `routers` routers and how many of each; None where some shard would
    lack a prefill or a decode worker (fewer of either than routers)."""
    if layout.gpus_per_engine < 1:  # a shared GPU's engines stay together, behind one router
        if routers > 1:
            raise ValueError("shards: engines that share GPUs are not split among routers")
        return {layout: 1}
    sizes = shard_sizes(layout.engines, routers)
    if layout.colocated:
        shards = [dataclasses.replace(layout, colocated=s) for s in sizes]
    else:
        if min(layout.prefill, layout.decode) < routers:
            return None
        prefill = [1] * routers
        for _ in range(layout.prefill - routers):
            # the next prefill engine to the shard with the fewest for its size, among those keeping a decode one
            i = min((i for i in range(routers) if prefill[i] < sizes[i] - 1), key=lambda i: (prefill[i] / sizes[i], i))
            prefill[i] += 1
        shards = [dataclasses.replace(layout, prefill=p, decode=s - p) for p, s in zip(prefill, sizes)]
    counts: dict[Layout, int] = {}
    for shard in shards:
        counts[shard] = counts.get(shard, 0) + 1
    return counts


def stretched(workload: Workload, factor: float) -> Workload:
    """The same requests arriving `factor` times as far apart (the prefix keys, computed once, stay shared)."""
    return dataclasses.replace(workload, arrivals=[t * factor for t in workload.arrivals])


def router_share(workload: Workload, rate: float, share: float) -> Workload:
    """What one router receives when the clients are split among the routers at random, `share` of the requests
    its own: a random `share` of the whole stream (a thinning), which is
    - for Poisson arrivals, a Poisson stream at `share` of the rate: the same requests `1 / share` times as far apart;
    - for gamma arrivals (gaps with CV c), a steadier stream: a kept request's gap sums a geometric number of the
      stream's gaps (CV^2 = 1 + share (c^2 - 1)). Stretching would keep the whole stream's bursts, each `1 / share`
      times as long. Drawn as many requests as the workload's;
    - for given times (a trace), a random `share` of its requests at their own times: what the router gets."""
    if share >= 1 or workload.arrival_cv == 1.0 or math.isinf(rate):
        return workload if share >= 1 else stretched(workload, 1 / share)
    rng = random.Random(f"{workload.seed}:{rate}:{share}:router share")
    if workload.arrival_cv is None:
        if workload.phases is not None:
            raise ValueError("a router's share of given arrival times: the workload has phases (a bench replay)")
        kept = [i for i in range(len(workload.arrivals)) if rng.random() < share] or [0]
        return dataclasses.replace(
            workload, arrivals=[workload.arrivals[i] for i in kept], prompts=[workload.prompts[i] for i in kept],
            output_lens=[workload.output_lens[i] for i in kept],
            keys={bs: [keys[i] for i in kept] for bs, keys in workload.keys.items()})
    shape = 1 / workload.arrival_cv ** 2
    t, times = 0.0, []
    for _ in workload.arrivals:
        # geometric: the stream's gaps to the next kept one
        gaps = 1 + int(math.log(1 - rng.random()) / math.log(1 - share))
        t += rng.gammavariate(gaps * shape, 1 / (rate * shape))  # their sum: a gamma of `gaps` times the shape
        times.append(t)
    return dataclasses.replace(workload, arrivals=times)


@dataclass(frozen=True)
class Outcome:
    """One shard simulated at its share of one rate: its own summary and its served requests' latencies."""

    point: Point
    ttfts: list[float]  # sorted, as the tpots: a mix of shards then merges sorted runs
    tpots: list[float]

    @classmethod
    def of(cls, name: str, rate: float, requests: list[SimRequest], slo: SLO) -> Outcome:
        recorded = records(requests)
        served = [r for r in recorded if r.ok]
        return cls(summarize(name, rate, requests, slo, recorded), sorted(r.ttft for r in served if r.ttft is not None),
                   sorted(t for r in served if (t := r.tpot) is not None))


def mix(layout: str, rate: float, parts: list[tuple[int, int, Outcome]]) -> Point:
    """A layout's point from its shards' outcomes: (engines in such shards, such shards, outcome). Requests are
    weighed by their shard's share of the traffic; goodput adds up over the shards."""
    engines = sum(e for e, _, _ in parts)
    if len(parts) == 1:
        _, count, o = parts[0]
        return dataclasses.replace(o.point, layout=layout, rate=rate, goodput=count * o.point.goodput)

    def weighed(values: Callable[[Outcome], list[float]]) -> list[tuple[float, list[float]]]:
        """Each shard's served requests' values, each weighed by its shard's engines over its served requests."""
        return [(e / len(served), served) for e, _, o in parts if (served := values(o))]

    ttft, tpot = run_percentiles(weighed(lambda o: o.ttfts)), run_percentiles(weighed(lambda o: o.tpots))
    share = [(e / engines, o.point) for e, _, o in parts]
    return Point(layout, rate, max(p.requests for _, p in share), *ttft, *tpot,
                 sum(w * p.attainment for w, p in share),
                 sum(count * o.point.goodput for _, count, o in parts), round(sum(w * p.refused for w, p in share)),
                 span_s=min(p.span_s for _, p in share), life_s=max(p.life_s for _, p in share))


def weighted_percentiles(pairs: list[tuple[float, float]], qs: tuple[float, ...] = (50, 90)) -> list[float]:
    """The `qs`-th percentiles of values with weights (value, weight): linear between the closest ranks as
    bench_metrics.percentile is, each value's rank the middle of its weight; inf with no values (`run_percentiles`,
    a run a value)."""
    return run_percentiles([(w, [v]) for v, w in pairs], qs)


def run_percentiles(runs: list[tuple[float, list[float]]], qs: tuple[float, ...] = (50, 90)) -> list[float]:
    """The `qs`-th percentiles of runs of values, each run of one weight, (weight, values): linear between the
    closest ranks as bench_metrics.percentile is, each value's rank the middle of its weight; inf with no values.
    Without a pair for each value (a plan mixes every split's shards at every rate). Sorted by value alone, stably,
    with the lighter runs first: among equal values the lighter go first."""
    runs = sorted((run for run in runs if run[0] > 0 and run[1]), key=operator.itemgetter(0))
    if not runs:
        return [math.inf] * len(qs)
    values = list(itertools.chain.from_iterable(v for _, v in runs))
    if len({w for w, _ in runs}) == 1:
        return [percentile(values, q) for q in qs]
    weights = list(itertools.chain.from_iterable(itertools.repeat(w, len(v)) for w, v in runs))
    order = sorted(range(len(values)), key=values.__getitem__)
    return _ranked([values[i] for i in order], [weights[i] for i in order], qs)


def _ranked(values: list[float], weights: list[float], qs: tuple[float, ...]) -> list[float]:
    """Weighted percentiles of sorted values (and their weights, in their order). A value's rank is the middle of its
    weight, the weights before it summed in order: the first whose middle reaches the target ends the search."""
    total = sum(weights)
    mids = list(map(operator.add, itertools.chain((0.0,), itertools.accumulate(weights)),
                    map(operator.truediv, weights, itertools.repeat(2))))
    out = []
    for q in qs:
        target = q / 100 * total
        i = bisect.bisect_left(mids, target)
        if i == 0 or i == len(mids):
            out.append(values[0 if i == 0 else -1])
            continue
        prev_v, v = values[i - 1], values[i]
        prev_mid, mid = mids[i - 1], mids[i]
        out.append(prev_v + (v - prev_v) * (target - prev_mid) / (mid - prev_mid) if mid > prev_mid else v)
    return out
