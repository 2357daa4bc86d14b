"""A plan behind several routers (scripts/planner/shards.py): each router fronts its own shard of the engines with
its share of the clients; a layout's figures are its shards', each distinct shard simulated once."""
from __future__ import annotations

import dataclasses
import random

import pytest

from scripts.bench_metrics import percentile
from scripts.bench_workloads import gamma_arrivals
from scripts.planner.config import SLO, PlanConfig
from scripts.planner.layout import Layout
from scripts.planner.plan import routers_for, run_plan
from scripts.planner.report import Point
from scripts.planner.shards import Outcome, mix, router_share, shard_sizes, shards_of, stretched, weighted_percentiles
from scripts.planner.sim import simulate
from tests.test_planner import make_profile, workload


def test_a_split_is_shared_among_routers_as_evenly_as_its_engines_go():
    layout = Layout(prefill=88, decode=40)
    shards = shards_of(layout, 22)
    assert sorted(shard_sizes(128, 22)) == [5] * 4 + [6] * 18
    assert sum(shards.values()) == 22
    assert sum(s.engines * k for s, k in shards.items()) == 128
    assert sum(s.prefill * k for s, k in shards.items()) == 88
    assert all(s.prefill >= 1 and s.decode >= 1 for s in shards)
    shares = [s.prefill / s.engines for s in shards]
    assert max(shares) - min(shares) <= 1 / 5 + 1e-9  # within one engine of the even share
    assert len(shards) <= 4  # a few distinct shards, whatever the split
    assert shards_of(Layout(prefill=3, decode=125), 4) is None  # a router without a prefill worker
    assert shards_of(Layout(colocated=10), 4) == {Layout(colocated=3): 2, Layout(colocated=2): 2}
    assert shards_of(Layout(prefill=2, decode=5), 1) == {Layout(prefill=2, decode=5): 1}


def test_a_routers_share_of_poisson_arrivals_is_the_same_requests_further_apart():
    w = workload(50, 10.0, 20, 4)
    s = router_share(w, 10.0, 1 / 3)
    assert s.arrivals == pytest.approx([3.0 * t for t in w.arrivals]) and s.prompts is w.prompts and s.keys is w.keys
    assert router_share(w, 10.0, 1.0) is w


def gaps_cv(times: list[float]) -> tuple[float, float]:
    gaps = [b - a for a, b in zip([0.0] + times, times)]
    mean = sum(gaps) / len(gaps)
    return mean, (sum((g - mean) ** 2 for g in gaps) / len(gaps)) ** 0.5 / mean


def test_a_routers_share_of_bursty_arrivals_is_a_thinned_stream_steadier_than_the_whole():
    """Clients split at random: a router gets a random tenth of a gamma stream of CV 3 at 100 req/s. Its gaps average
    1 / (10 req/s) and their CV^2 is 1 + 0.1 (3^2 - 1) = 1.8, where stretching the stream would keep CV 3."""
    n, rate, cv = 20000, 100.0, 3.0
    w = dataclasses.replace(workload(n, rate, 8, 2), arrivals=gamma_arrivals(random.Random(1), n, rate, cv),
                            arrival_cv=cv, seed=1)
    assert gaps_cv(w.arrivals)[1] == pytest.approx(cv, rel=0.06)
    s = router_share(w, rate, 0.1)
    mean, got = gaps_cv(s.arrivals)
    assert len(s.arrivals) == n and s.prompts is w.prompts
    assert mean == pytest.approx(1 / (0.1 * rate), rel=0.05)
    assert got == pytest.approx(1.8 ** 0.5, rel=0.05)
    assert router_share(w, rate, 0.1).arrivals == s.arrivals  # seeded: every process draws the same


def test_a_routers_share_of_a_trace_is_a_random_share_of_its_requests_at_their_own_times():
    w = dataclasses.replace(workload(2000, 50.0, 8, 2), arrival_cv=None)
    w.keys[16] = list(range(2000))  # stands in for each prompt's keys: they follow their request
    s = router_share(w, 50.0, 0.25)
    assert 400 < len(s.arrivals) < 600
    kept = [w.arrivals.index(t) for t in s.arrivals]
    assert kept == sorted(kept) and s.keys[16] == kept
    assert s.prompts == [w.prompts[i] for i in kept] and s.output_lens == [w.output_lens[i] for i in kept]


def test_a_layout_of_alike_shards_predicts_what_one_shard_does_with_their_goodput_added():
    """2P:2D behind two routers is two 1P:1D clusters, each with half the clients: its latencies are one of them
    simulated alone at half the rate, and its goodput twice that one's."""
    profile, slo = make_profile(), SLO(1.0, 0.05)
    cfg = PlanConfig(profile="given", gpus=4, seed=0, disagg_policies="always", rates="8", num_requests=80,
                     input_len="200", output_len="20", routers=2)
    told = []
    plan = run_plan(cfg, [profile], progress=told.append)
    assert told[-1].startswith("simulated 2 of the 2 layouts and rates started so far")  # 1P:1D, colocated x2
    assert plan.routers[1] == {"disagg": 2, "colocated": 2}
    assert list(plan.results) == ["2P:2D", "colocated x4"]  # 1P:3D and 3P:1D leave a router without a role
    from scripts.planner.plan import workloads

    (rate, w), = workloads(cfg)
    alone = Outcome.of("1P:1D", rate, simulate(profile, Layout(prefill=1, decode=1, transport="nccl"),
                                                stretched(w, 2.0)), slo).point  # Poisson: a router's share
    got = plan.results["2P:2D"][0]
    assert alone.requests == 80 and got.layout == "2P:2D" and got.rate == 8
    assert (got.ttft_p50, got.ttft_p90, got.tpot_p50, got.tpot_p90, got.attainment) == (
        alone.ttft_p50, alone.ttft_p90, alone.tpot_p50, alone.tpot_p90, alone.attainment)
    assert got.goodput == pytest.approx(2 * alone.goodput)


def outcome(ttfts: list[float], attainment: float = 1.0, goodput: float = 1.0) -> Outcome:
    point = Point("s", 1.0, len(ttfts), 0, 0, 0, 0, attainment, goodput, span_s=10.0, life_s=1.0)
    return Outcome(point, ttfts, [0.01] * len(ttfts))


def test_shards_mix_by_their_share_of_the_traffic():
    fast, slow = outcome([0.1] * 100, attainment=1.0, goodput=5.0), outcome([2.0] * 100, attainment=0.5,
                                                                              goodput=2.0)
    # 9 engines in 3 fast shards, 3 in one slow one: three quarters of the requests are fast
    p = mix("x", 40.0, [(9, 3, fast), (3, 1, slow)])
    assert (p.layout, p.rate) == ("x", 40.0)
    assert p.ttft_p50 == 0.1 and p.ttft_p90 == 2.0
    assert p.attainment == pytest.approx(0.75 * 1.0 + 0.25 * 0.5)
    assert p.goodput == pytest.approx(3 * 5.0 + 1 * 2.0)
    same = mix("y", 1.0, [(2, 1, fast), (4, 2, dataclasses.replace(fast))])
    assert same.ttft_p90 == 0.1


def test_equal_weights_give_the_bench_percentile():
    values = [0.3, 0.1, 0.7, 0.2, 0.9, 0.4]
    qs = (10, 50, 90, 99)
    assert weighted_percentiles([(v, 2.0) for v in values], qs) == [percentile(values, q) for q in qs]


def test_weighted_percentiles_follow_the_weights():
    pairs = [(1.0, 3.0), (2.0, 1.0)]
    p10, p50, p99 = weighted_percentiles(pairs, (10, 50, 99))
    assert p10 == 1.0 and p99 == 2.0
    assert 1.0 <= p50 < 1.5
    assert weighted_percentiles([], (50,)) == [float("inf")]
    assert weighted_percentiles(list(reversed(pairs)), (10, 50, 99)) == [p10, p50, p99]  # any order in


def test_the_routers_are_those_the_top_rate_needs_unless_given():
    cfg = PlanConfig(profile="given", router_rps=50)
    assert routers_for(cfg, "disagg", 16, 120, 0) == 3
    assert routers_for(cfg, "disagg", 16, 40, 0) == 1
    assert routers_for(cfg, "disagg", 4, 1000, 0) == 2  # at most one per prefill and decode pair
    assert routers_for(cfg, "colocated", 4, 1000, 0) == 4
    assert routers_for(dataclasses.replace(cfg, routers=5), "disagg", 16, 40, 0) == 5
    assert routers_for(dataclasses.replace(cfg, routers=9), "disagg", 16, 40, 0) == 9  # no split serves them all
    with pytest.raises(ValueError, match="--routers 17: more than the 16 engines"):
        routers_for(dataclasses.replace(cfg, routers=17), "colocated", 16, 40, 0)
    with pytest.raises(ValueError, match="--routers"):
        PlanConfig(profile="given", routers=-1)


def test_many_splits_behind_many_routers_come_from_few_shards_and_the_table_keeps_a_grid():
    profile = make_profile()
    cfg = PlanConfig(profile="given", gpus=64, seed=0, disagg_policies="always", rates="40", num_requests=60,
                     input_len="100", output_len="8", routers=8)
    plan = run_plan(cfg, [profile])
    splits = [name for name in plan.results if not name.startswith("colocated")]
    assert splits == [f"{x}P:{64 - x}D" for x in range(8, 57)]  # every split giving each router one of each
    assert plan.unsharded[1] == 14 and not plan.skipped_splits
    shown = [name for name in splits if name not in plan.hidden]
    assert 3 < len(shown) <= 16 + 3 and set(plan.hidden) < set(splits)


def test_more_routers_than_a_split_can_serve_leave_the_splits_out_not_the_plan():
    """Two GPUs behind two routers: each router gets a colocated engine; no split gives each a prefill and a decode
    engine, so the plan has colocated only, and says why."""
    from scripts.cli.plan import router_lines

    cfg = PlanConfig(profile="given", gpus=2, seed=0, disagg_policies="always", rates="8", num_requests=40,
                     input_len="100", output_len="8", routers=2)
    plan = run_plan(cfg, [make_profile()])
    assert list(plan.results) == ["colocated x2"] and plan.unsharded[1] == 1
    assert router_lines(plan) == [
        "routers: disagg: no split of 2 engines gives each of 2 routers a prefill and a decode engine; none planned",
        "routers: colocated layouts behind 2 routers, each in front of 1 engine with its share of the clients: each "
        "layout predicted from its shards, each simulated alone (--routers 1: one router, simulated whole)"]


def test_a_redraw_on_the_plans_own_seed_repeats_it_and_on_another_moves_it():
    """The noise line: the pick simulated again on another draw of the workload. On the plan's own seed the redraw is
    the plan's figures exactly (the same shards, the same requests); on another, the same rates, other figures."""
    from scripts.planner.plan import redraw
    from scripts.planner.report import moved, noise_line

    cfg = PlanConfig(profile="given", gpus=4, seed=0, disagg_policies="always", rates="8,16", num_requests=80,
                     input_len="100:300", output_len="10:30", routers=2)
    plan = run_plan(cfg, [make_profile()])
    assert redraw(plan, "2P:2D", 0) == plan.results["2P:2D"]
    assert redraw(plan, "colocated x4", 0) == plan.results["colocated x4"]
    other = redraw(plan, "2P:2D", 1)
    assert [p.rate for p in other] == [8, 16] and other != plan.results["2P:2D"]
    moves = moved(plan.results["2P:2D"], other)
    assert set(moves) == {"ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90", "goodput"}
    assert moves["ttft_p50"] > 0 and moves == moved(plan.results["2P:2D"], other)
    assert moved(other, other) == dict.fromkeys(moves, 0.0)
    assert noise_line("2P:2D", 1, {"ttft_p50": 0.123, "goodput": float("nan")}).startswith(
        "noise: 2P:2D again on another draw of the workload (--seed 1), the most each figure moved over the rates: "
        "TTFT p50 12%. ")


def test_the_pick_on_slower_gpus_is_slower_and_says_whether_it_still_sustains_its_rate(monkeypatch):
    """The machine line: the pick simulated again, on the plan's own draw, on GPUs a share slower in every step.
    Not slower at all, it is the plan's figures exactly; slower, every request's steps take longer."""
    from scripts.planner.plan import redraw
    from scripts.planner.report import machine_line

    cfg = PlanConfig(profile="given", gpus=4, seed=0, disagg_policies="always", rates="8,16", num_requests=80,
                     input_len="100:300", output_len="10:30", routers=2)
    plan = run_plan(cfg, [make_profile()])
    first = plan.results["2P:2D"]
    assert redraw(plan, "2P:2D", 0, slower=0.0) == first
    monkeypatch.setattr("scripts.planner.plan.workloads", lambda cfg: pytest.fail("the plan's own draw drawn again"))
    slow = redraw(plan, "2P:2D", 0, slower=0.5)
    assert [p.rate for p in slow] == [8, 16]
    for a, b in zip(first, slow):
        assert b.ttft_p50 > a.ttft_p50 and b.tpot_p50 > a.tpot_p50
    line = machine_line("2P:2D", 0.5, first, slow, SLO(10.0, 10.0))
    assert line.startswith("machine: 2P:2D on GPUs 50% slower in every step (machines of one kind differ by a few "
                           "percent; --slower-gpus), the most each figure moved over the rates: TTFT p50 ")
    assert line.endswith("; it still sustains 16 req/s")
    missed = [dataclasses.replace(p, attainment=0.5) if p.rate == 16 else p for p in slow]
    assert machine_line("2P:2D", 0.5, first, missed, SLO(10.0, 10.0)).endswith("; it sustains 8 req/s instead of 16")
    missed = [dataclasses.replace(p, attainment=0.5) for p in slow]
    assert machine_line("2P:2D", 0.5, first, missed, SLO(10.0, 10.0)).endswith("; it sustains no rate tried")
