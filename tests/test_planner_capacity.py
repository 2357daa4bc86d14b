"""What a number of engines could serve at most, from a profile, and the rates a plan given none simulates."""
from __future__ import annotations

import dataclasses

import pytest

from scripts.planner.capacity import capacity, decode_seats, default_rates, prompt_seconds
from scripts.planner.config import PlanConfig
import scripts.planner.plan as planner
from scripts.planner.plan import run_plan, workloads
from scripts.planner.profile import DecodeCost, HandoffCost, PrefillCost, Profile


def flat_profile(**overrides) -> Profile:
    """Costs whose sums are easy to write down: a prompt token 0.1 ms, a decode step 10 ms whatever its batch."""
    fields = dict(machine="test", model="test", block_size=16, num_kv_blocks=100_000, kv_bytes_per_token=1000,
                  max_num_batched_tokens=8192, max_num_seqs=10, host_launch_s=0.0,
                  prefill=PrefillCost(base_s=0.0, per_token_s=1e-4), decode=DecodeCost(base_s=0.01, per_seq_s=0.0),
                  handoff={"host": HandoffCost(base_s=0.001, bytes_per_s=1e9)})
    fields.update(overrides)
    profile = Profile(**fields)
    profile.check()
    return profile


def test_engines_serve_as_many_requests_as_their_gpu_seconds_allow():
    # A 1,000-token prompt: 0.1 s of prompt steps; 11 tokens out: 10 decode steps of 10 ms, shared by 10 seats.
    cap = capacity(flat_profile(), [1000] * 5, [11] * 5, engines=4, slo_tpot=1.0)
    assert cap.prefill_s == pytest.approx(0.1) and cap.decode_s == pytest.approx(0.01) and cap.seats == 10
    assert cap.rate == pytest.approx(4 / 0.11)
    assert default_rates(cap) == [18, 27, 36, 45]  # half to 1.25 times 36.4 req/s, two digits each


def test_a_prompt_step_full_of_short_prompts_shares_its_base():
    profile = flat_profile(prefill=PrefillCost(base_s=0.08, per_token_s=1e-5))
    assert prompt_seconds(profile, 1024) == pytest.approx((0.08 + 8192 * 1e-5) / 8)  # eight to a step
    assert prompt_seconds(profile, 8192) == pytest.approx(0.08 + 8192 * 1e-5)


def test_a_prompt_longer_than_the_budget_takes_its_chunks_each_after_the_ones_before():
    profile = flat_profile(prefill=PrefillCost(base_s=0.0, per_token_s=1e-5, per_token_context_s=1e-9))
    assert prompt_seconds(profile, 10_000) == pytest.approx(10_000 * 1e-5 + 1808 * 8192 * 1e-9)


def test_decode_seats_are_bounded_by_the_kv_cache_and_by_the_tpot_slo():
    assert decode_seats(flat_profile(num_kv_blocks=100), context=400, slo_tpot=1.0) == 4  # 1,600 tokens of KV
    growing = flat_profile(max_num_seqs=256, decode=DecodeCost(base_s=0.01, per_seq_s=0.001))
    assert decode_seats(growing, context=100, slo_tpot=0.05) == 40  # 10 ms + 40 x 1 ms
    assert decode_seats(growing, context=100, slo_tpot=0.001) == 1  # none fits: one at least
    # Fewer seats make each request's share of a step larger
    assert capacity(growing, [100] * 3, [101] * 3, 1, slo_tpot=0.03).decode_s == pytest.approx(100 * 0.03 / 20)


def test_a_plan_given_no_rates_simulates_fractions_of_what_its_gpus_could_serve():
    profile = flat_profile(max_num_seqs=64, host_launch_s=0.001)
    cfg = PlanConfig(profile="p.json", gpus=2, num_requests=40, input_len="100:300", output_len="8:16",
                     disagg_policies="always", slower_gpus=0.0)
    plan = run_plan(cfg, [profile])
    assert plan.capacity is not None and plan.capacity.rate > 0
    assert [rate for rate, _ in plan.loads] == default_rates(plan.capacity)
    assert all(len(points) == 4 for points in plan.results.values())
    given = run_plan(dataclasses.replace(cfg, rates="5"), [profile])
    assert given.capacity is None and [rate for rate, _ in given.loads] == [5]


def test_more_gpus_get_proportionally_higher_rates():
    one, many = (capacity(flat_profile(), [500] * 10, [50] * 10, engines=n, slo_tpot=1.0) for n in (2, 128))
    assert many.rate == pytest.approx(64 * one.rate)


def test_the_rates_reckoning_and_the_first_load_point_share_one_draw(monkeypatch):
    profile = flat_profile(max_num_seqs=64, host_launch_s=0.001)
    cfg = PlanConfig(profile="p.json", gpus=2, num_requests=40, input_len="100:300", output_len="8:16",
                     disagg_policies="always", slower_gpus=0.0)
    drawn = []
    draw = planner.point_requests
    monkeypatch.setattr(planner, "point_requests",
                        lambda cfg, i, *rest, **kw: drawn.append(i) or draw(cfg, i, *rest, **kw))
    plan = run_plan(cfg, [profile])
    assert sorted(drawn) == [0, 1, 2, 3]
    fresh = workloads(plan.config)
    assert [(w.arrivals, w.prompts, w.output_lens) for _, w in plan.loads] == [
        (w.arrivals, w.prompts, w.output_lens) for _, w in fresh]
