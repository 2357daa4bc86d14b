"""What the planner computes once and reuses gives what computing it afresh gives: the router's check of a prompt a
workload's simulations share, and the weighted percentiles of a layout's mix of shards; and each load an engine
reports carries the scheduler's own queued tokens."""
from __future__ import annotations

import random

import pytest

import router.admission
from common.sampling_params import InvalidRequest
from scripts.planner.engine import SimEngine
from scripts.planner.layout import Layout
from scripts.planner.shards import run_percentiles, weighted_percentiles
from scripts.planner.sim import Simulation, simulate
from scripts.planner.workload import Workload
from tests.test_planner import make_profile
from tests.test_planner_bulk import mixed

LAYOUTS = [Layout(prefill=1, decode=2), Layout(prefill=2, decode=1, policy="auto"), Layout(colocated=2)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_load_reports_the_schedulers_own_queued_tokens(layout, monkeypatch):
    """Overloaded, so prompts wait on the engines: each load's queued tokens are what the scheduler sums then."""
    loads = []
    report = SimEngine.load

    def checked(engine: SimEngine, now: float):
        load = report(engine, now)
        assert load.queued_tokens == engine.scheduler.queued_tokens()  # a pool's lane holds every prompt chunk
        loads.append(load.queued_requests)
        return load

    monkeypatch.setattr(SimEngine, "load", checked)
    Simulation(make_profile(), layout, mixed(300, 400.0, 1)).run()
    assert max(loads) > 2  # prompts did wait


def _copy(w: Workload) -> Workload:
    return Workload(list(w.arrivals), [list(p) for p in w.prompts], list(w.output_lens), w.shared_prefixes)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_workloads_prompts_are_checked_once_and_its_simulations_are_as_fresh_ones(layout, monkeypatch):
    checks = []
    check = router.admission.check_prompt
    monkeypatch.setattr(router.admission, "check_prompt", lambda ids, *limits: checks.append(1) or check(ids, *limits))
    profile, load = make_profile(), mixed(200, 60.0, 2)
    fresh = simulate(profile, layout, _copy(load))
    assert len(checks) == 200
    first, again = simulate(profile, layout, load), simulate(profile, layout, load)
    assert len(checks) == 400  # the second simulation of `load` checked none
    for runs in zip(fresh, first, again, strict=True):
        assert len({(r.rid, r.first, r.done, r.refused) for r in runs}) == 1


def test_a_prompt_is_checked_again_under_other_limits_and_a_failed_check_is_not_kept():
    sim = Simulation(make_profile(), Layout(prefill=1, decode=1), mixed(10, 10.0, 3))
    ids = [5, 500]
    sim.admission.check(ids, 1 << 30, 1 << 30)
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            sim.admission.check(ids, 1 << 30, 100)  # id 500 is beyond a vocabulary of 100
    assert len(sim.admission.passed) == 1
    with pytest.raises(InvalidRequest):
        sim.admission.check(list(ids), 1, 1 << 30)  # another list, too long for max_model_len 1


def _walk(pairs: list[tuple[float, float]], q: float) -> float:
    """The weighted percentile by a walk up the sorted pairs, each value's rank the middle of its weight."""
    pairs = sorted(p for p in pairs if p[1] > 0)
    total = sum(w for _, w in pairs)
    target, below = q / 100 * total, 0.0
    prev_v, prev_mid = pairs[0][0], pairs[0][1] / 2
    if target <= prev_mid:
        return prev_v
    for v, w in pairs:
        mid = below + w / 2
        if mid >= target:
            return prev_v + (v - prev_v) * (target - prev_mid) / (mid - prev_mid) if mid > prev_mid else v
        prev_v, prev_mid, below = v, mid, below + w
    return pairs[-1][0]


def test_weighted_percentiles_are_those_of_a_walk_up_the_weights():
    rng = random.Random(4)
    for _ in range(500):
        pairs = []
        for weight in rng.sample([1.0, 0.5, 6 / 1000, 5 / 997, rng.random(), 0.0], rng.randint(2, 4)):
            pairs += [(rng.choice([rng.random(), 0.25]), weight) for _ in range(rng.randint(1, 40))]
        rng.shuffle(pairs)
        if len({w for _, w in pairs if w > 0}) < 2:
            continue
        qs = (0, 50, 90, 100, rng.uniform(0, 100))
        assert weighted_percentiles(pairs, qs) == [_walk(pairs, q) for q in qs]


def test_percentiles_of_runs_are_those_of_their_pairs():
    """A mix of shards takes its percentiles from each shard's sorted values and one weight a shard (`run_percentiles`):
    the figures of the pairs, ties across shards and shards of equal weight among them."""
    rng = random.Random(5)
    for _ in range(500):
        runs = [(weight, sorted(rng.choice([rng.random(), 0.25, 0.5]) for _ in range(rng.randint(0, 40))))
                for weight in rng.sample([1.0, 0.5, 6 / 1000, 5 / 997, rng.random(), 0.0, 0.5], rng.randint(1, 4))]
        qs = (0, 50, 90, 100, rng.uniform(0, 100))
        pairs = [(v, w) for w, values in runs for v in values]
        assert run_percentiles(runs, qs) == weighted_percentiles(pairs, qs)
