"""Engines sharing a GPU in the planner's simulator (scripts/planner/gpu.py): time-sliced (while n engines have
steps in flight, each goes at 1/n of the GPU, except an eager step's launch-bound floor, at its host's pace), each
engine with its memory share of the KV blocks; fast-forward agrees with stepping."""
from __future__ import annotations

import msgspec
import pytest

from scripts.planner.gpu import Gpu, pack
from scripts.planner.layout import Layout
from scripts.planner.profile import MpsCost, ProfileError
from scripts.planner.sim import Simulation, simulate
from scripts.planner.workload import Workload
from tests.test_planner import make_profile, workload


def test_engines_are_packed_onto_gpus_in_launch_order():
    assert pack([0.5] * 4) == [0, 0, 1, 1]
    assert pack([1.0] * 3) == [0, 1, 2]
    assert pack([0.3] * 4) == [0, 0, 0, 1]
    assert Layout(prefill=1, decode=1, gpus_per_engine=0.5).gpus() == [0, 0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_two_engines_on_one_gpu_time_slice_it(fast_forward):
    """Two colocated replicas on one GPU, one request each, both at 0: each prefill's launch-bound floor goes at its
    host's pace, side by side, and the rest at half the GPU; then both decode at once, each decode step (a graph
    replay, GPU-bound) at half its pace alone: twice as long as on a GPU of its own."""
    profile = make_profile()
    prompt, output = 300, 20
    load = Workload([0.0, 0.0], [list(range(prompt)), list(range(10_000, 10_000 + prompt))], [output] * 2,
                    shared_prefixes=False)
    launch = profile.host_launch_s
    prefill = launch + profile.prefill.seconds(prompt, 0)
    floor = launch + profile.prefill.base_s
    decodes = [launch + profile.decode.seconds(1, prompt + i) for i in range(output - 1)]

    alone = simulate(profile, Layout(colocated=2), load, fast_forward=fast_forward)
    assert [r.first for r in alone] == pytest.approx([prefill + launch] * 2, rel=1e-12)  # once the next launched
    assert [r.done for r in alone] == pytest.approx([prefill + sum(decodes)] * 2, rel=1e-12)

    shared = simulate(profile, Layout(colocated=2, gpus_per_engine=0.5), load, fast_forward=fast_forward)
    prefilled = floor + 2 * (prefill - floor)
    assert [r.first for r in shared] == pytest.approx([prefilled + launch] * 2, rel=1e-12)
    assert [r.done for r in shared] == pytest.approx([prefilled + 2 * sum(decodes)] * 2, rel=1e-12)


def test_a_decode_step_beside_an_eager_step_goes_at_half_pace_until_that_step_ends():
    """Processor sharing, by hand: an eager step of 10 ms, 8 of them its launch-bound floor, from 0; a decode step of
    4 ms from 9 ms, when the eager step has 1 ms of GPU work left. Both then go at half pace: the eager step ends at
    11 ms, and the decode step, 1 ms of its work done by then, at 11 + 3 = 14 ms."""
    gpu = Gpu(0, shared=True)
    prefill, decode = object(), object()
    gpu.add(prefill, 0.010, 0.0, host_seconds=0.008)
    assert gpu.ends(0.0)[prefill] == pytest.approx(0.010)
    gpu.add(decode, 0.004, 0.009)
    ends = gpu.ends(0.009)
    assert ends[prefill] == pytest.approx(0.011) and ends[decode] == pytest.approx(0.017)
    gpu.remove(prefill, 0.011)
    assert gpu.ends(0.011)[decode] == pytest.approx(0.014)


def test_each_engine_on_a_shared_gpu_holds_its_share_of_the_kv_blocks():
    profile = make_profile(num_kv_blocks=1001)
    sim = Simulation(profile, Layout(prefill=1, decode=1, gpus_per_engine=0.5), workload(1, 1.0, 10, 2))
    assert {e.block_manager.num_blocks for e in sim.engines.values()} == {500}
    assert all(info.load.kv_blocks_total == 500 for info in sim.infos.values())
    assert len(sim.gpus) == 1


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=1, gpus_per_engine=0.5),
                                    Layout(prefill=1, decode=1, policy="auto", gpus_per_engine=0.5),
                                    Layout(colocated=2, gpus_per_engine=0.5)], ids=str)
def test_fast_forward_on_a_shared_gpu_changes_no_prediction(layout):
    """A fast decode run ends with its step in flight when the other engine on its GPU has a step ready."""
    profile = make_profile()
    load = workload(300, 20.0, 300, 60, seed=2)
    bulk = simulate(profile, layout, load)
    stepped = simulate(profile, layout, load, fast_forward=False)
    for a, b in zip(bulk, stepped):
        assert (a.first, a.done) == pytest.approx((b.first, b.done), rel=1e-9)


def test_sharing_one_gpu_is_slower_than_a_gpu_each():
    profile = make_profile()
    load = workload(200, 15.0, 300, 60, seed=3)
    own = simulate(profile, Layout(prefill=1, decode=1), load)
    shared = simulate(profile, Layout(prefill=1, decode=1, gpus_per_engine=0.5), load)
    mean = lambda reqs, f: sum(map(f, reqs)) / len(reqs)  # noqa: E731
    assert mean(shared, lambda r: r.tpot) > 1.1 * mean(own, lambda r: r.tpot)
    assert mean(shared, lambda r: r.ttft) > mean(own, lambda r: r.ttft)


def test_under_mps_each_step_goes_at_its_pace_beside_the_other():
    """By hand: a prompt step of 10 ms from 0 (c 0.25) and a decode step of 4 ms from 2 ms (c 1). Side by side the
    prompt goes at 1/1.25 and the decode at 1/2: the decode's 4 ms end at 10 ms, the prompt then has 10 - 2 - 6.4 =
    1.6 ms of work left, alone: it ends at 11.6 ms (time-sliced, both at 1/2, it would end at 14 ms)."""
    gpu = Gpu(0, shared=True)
    prefill, decode = object(), object()
    gpu.add(prefill, 0.010, 0.0, beside=0.25)
    gpu.add(decode, 0.004, 0.002, beside=1.0)
    assert gpu.ends(0.002)[decode] == pytest.approx(0.010)
    gpu.remove(decode, 0.010)
    assert gpu.ends(0.010)[prefill] == pytest.approx(0.0116)
    assert gpu.pace(prefill) == 1.0 and not gpu.beside.get(decode)


def test_under_mps_a_steps_c_can_follow_the_longest_prompt_of_the_pair():
    """`beside_by_prompt`: c read linearly between its points, held beyond them. By hand: a decode step of 4 ms from 0
    beside a prompt step of one 6,000-token prompt from 0 (10 ms of work): decode c 2.0 there, prefill c 0.2. The
    decode step goes at 1/3 and ends at 12 ms; the prompt step at 1/1.2 until then (10 ms of its work done), and ends
    at 12 ms. Beside a 300-token prompt step instead (its 10 ms too), decode c 0.25: it ends at 5 ms."""
    decode = MpsCost(beside_by_prompt=[(300, 0.25), (6000, 2.0)])
    prefill = MpsCost(beside_by_prompt=[(300, 0.7), (6000, 0.2)])
    assert [decode.contention(n) for n in (100, 300, 3150, 6000, 9000)] == pytest.approx([0.25, 0.25, 1.125, 2.0, 2.0])
    assert MpsCost(beside=0.4).contention(6000) == 0.4
    for tokens, decode_end in ((6000, 0.012), (300, 0.005)):
        gpu = Gpu(0, shared=True)
        p, d = object(), object()
        gpu.add(p, 0.010, 0.0, beside=prefill.contention, longest=tokens)
        gpu.add(d, 0.004, 0.0, beside=decode.contention)
        assert gpu.ends(0.0)[d] == pytest.approx(decode_end)
    assert gpu.ends(0.0)[p] == pytest.approx(0.010 * 1.7)
    with pytest.raises(ProfileError, match="tokens must rise"):
        MpsCost(beside_by_prompt=[(6000, 2.0), (300, 0.25)]).check("mps.decode")
    with pytest.raises(ProfileError, match="finite number >= 0"):
        MpsCost(beside_by_prompt=[(300, -1.0)]).check("mps.decode")


def test_under_mps_a_steps_c_can_grow_with_the_decode_rows_of_the_pair():
    """`beside_by_rows`: a factor on c by the rows of the pair's decode step (whichever engine's), read as the prompt
    points are; none: 1. By hand: a prompt step of 10 ms of work (c 0.35 by prompt) beside a decode step of 42 rows
    (factor 1 at 12 rows, 1.8 at 52: 1.6 at 42) goes at 1 / (1 + 0.35 x 1.6) while the decode step runs; beside one
    of 4 rows, at 1 / 1.35. The decode step's own c reads the same rows (its own), scaled by its role's factor."""
    prefill = MpsCost(beside_by_prompt=[(1600, 0.35), (6000, 0.17)], beside_by_rows=[(12, 1.0), (52, 1.8)])
    assert prefill.by_step and MpsCost(beside_by_rows=[(8, 2.0)]).by_step and not MpsCost(beside=0.3).by_step
    assert [prefill.contention(1000, r) for r in (0, 12, 42, 52, 64)] == pytest.approx(
        [0.35, 0.35, 0.35 * 1.6, 0.35 * 1.8, 0.35 * 1.8])
    assert MpsCost(beside=0.4, beside_by_rows=[(12, 1.0), (52, 1.8)]).contention(6000, 52) == pytest.approx(0.72)
    assert MpsCost(beside_by_prompt=[(300, 0.25)]).contention(300, 64) == 0.25
    for rows, c in ((42, 0.35 * 1.6), (4, 0.35)):
        gpu = Gpu(0, shared=True)
        p, d = object(), object()
        gpu.add(p, 0.010, 0.0, beside=prefill.contention, longest=1000)
        gpu.add(d, 1.0, 0.0, beside=0.0, rows=rows)  # decoding throughout
        assert gpu.pace(p) == pytest.approx(1 / (1 + c))
        assert gpu.ends(0.0)[p] == pytest.approx(0.010 * (1 + c))
    with pytest.raises(ProfileError, match="rows must rise"):
        MpsCost(beside_by_rows=[(52, 1.8), (12, 1.0)]).check("mps.prefill")
    with pytest.raises(ProfileError, match="each factor must be a finite number >= 0"):
        MpsCost(beside_by_rows=[(12, float("nan"))]).check("mps.prefill")


def test_a_prefill_workers_steps_under_mps_take_longer_beside_a_larger_decode_batch():
    """1P:1D under MPS, the same requests: with prefill's c growing with the decode rows beside it, the prompt
    steps beside a busy decode worker take longer, so first tokens come later; with the factor 1 throughout, the
    predictions are those without it."""
    base = {"prefill": MpsCost(beside=0.35), "decode": MpsCost(beside=0.5)}
    grown = dict(base, prefill=MpsCost(beside=0.35, beside_by_rows=[(1, 1.0), (8, 3.0)]))
    flat = dict(base, prefill=MpsCost(beside=0.35, beside_by_rows=[(1, 1.0)]))
    layout = Layout(prefill=1, decode=1, gpus_per_engine=0.5, mps=True)
    wl = workload(60, 40.0, 1000, 64, seed=3)

    def ttfts(mps: dict) -> list[float]:
        requests = Simulation(msgspec.structs.replace(make_profile(num_kv_blocks=1000), mps=mps), layout, wl).run()
        return [r.first - r.arrival for r in requests]

    assert ttfts(flat) == pytest.approx(ttfts(base))
    assert sum(ttfts(grown)) > 1.05 * sum(ttfts(base))


def mps_profile(alone: float = 1.0, **beside: float):
    mps = {role: MpsCost(alone=alone, beside=c) for role, c in beside.items()}
    return msgspec.structs.replace(make_profile(num_kv_blocks=1000), mps=mps)


@pytest.mark.parametrize("layout", [Layout(prefill=1, decode=1, gpus_per_engine=0.5, mps=True),
                                    Layout(colocated=2, gpus_per_engine=0.5, mps=True)], ids=str)
def test_under_mps_without_contention_engines_on_one_gpu_run_as_on_a_gpu_each_with_half_the_blocks(layout):
    """A profile whose roles slow nothing under MPS: the same requests' times as on a GPU each whose profile holds
    half the blocks. With the contention of time-slicing (1, the default) the decode steps are as slow as in turns,
    and a contention between gives times between."""
    import dataclasses

    load = workload(200, 15.0, 300, 60, seed=3)
    free = simulate(mps_profile(prefill=0.0, decode=0.0, colocated=0.0), layout, load)
    halves = simulate(make_profile(num_kv_blocks=500), dataclasses.replace(layout, gpus_per_engine=1.0, mps=False),
                      load)
    times = lambda reqs: [t for r in reqs for t in (r.first, r.done)]  # noqa: E731
    assert times(free) == pytest.approx(times(halves), rel=1e-9)
    between = simulate(mps_profile(prefill=0.35, decode=0.35, colocated=0.35), layout, load)
    full = simulate(mps_profile(), layout, load)
    tpot = lambda reqs: sum(r.tpot for r in reqs)  # noqa: E731
    assert tpot(free) < tpot(between) < tpot(full)
    turns = simulate(make_profile(num_kv_blocks=1000), dataclasses.replace(layout, mps=False), load)
    assert tpot(full) == pytest.approx(tpot(turns), rel=0.05)
    assert "under MPS" in str(layout)


def test_under_mps_a_step_alone_takes_its_roles_alone_share_of_its_gpu_bound_work():
    """`alone` 1.5 and nothing beside: a decode run's steps (graph replays, all GPU-bound) 1.5 times as long."""
    import dataclasses

    load = Workload([0.0], [list(range(300))], [40], shared_prefixes=False)
    layout = Layout(prefill=1, decode=1, gpus_per_engine=0.5, mps=True)
    [free] = simulate(mps_profile(prefill=0.0, decode=0.0), layout, load)
    [capped] = simulate(mps_profile(alone=1.5, prefill=0.0, decode=0.0), layout, load)
    assert capped.tpot == pytest.approx(1.5 * free.tpot, rel=1e-9)
    [turns] = simulate(make_profile(num_kv_blocks=1000), dataclasses.replace(layout, mps=False), load)
    assert turns.tpot == pytest.approx(free.tpot, rel=1e-9)  # one request: never two steps at once


def test_a_profile_names_its_mps_costs_by_role():
    base = mps_profile()
    for bad, message in (({"router": MpsCost()}, "not a role"), ({"decode": MpsCost(beside=-1.0)}, "beside"),
                         ({"decode": MpsCost(alone=0.0)}, "alone"), ({"prefill": MpsCost(beside=float("nan"))},
                                                                      "beside")):
        with pytest.raises(ProfileError, match=message):
            msgspec.structs.replace(base, mps=bad).check()
    msgspec.structs.replace(base, mps={"prefill": MpsCost(beside=0.35), "decode": MpsCost(alone=1.12)}).check()
    assert base.mps_cost("colocated") == MpsCost(alone=1.0, beside=1.0)



def test_the_stored_decode_cap_is_the_measured_pair_of_profiles_ratio():
    """The shipped H200 Qwen3-0.6B profile's decode `alone`: stop 54's machine profiled uncapped and as an MPS client
    at `serve --mps`'s 50% decode share; their decode costs' ratio averaged over batches of 4-64 (1k tokens of context
    each). At 50% the ratio grows with the batch (1.17 at 4, 1.28 at 64), unlike stop 49's flat 1.12 at 70%."""
    from pathlib import Path

    from scripts.planner.profile import load_profile

    runs = Path(__file__).resolve().parent.parent / "docs" / "gpu_runs" / "stop54_profiles"
    uncapped = load_profile(runs / "h200-1653924120130-qwen3-0.6b.json")
    capped = load_profile(runs / "h200-1653924120130-qwen3-0.6b-mps50.json")
    assert "as an MPS client at 50% of the SMs" in capped.note

    def step(p, batch):
        return p.host_launch_s + p.decode_cost(batch).seconds(batch, batch * 1024)

    ratios = [step(capped, b) / step(uncapped, b) for b in (4, 8, 16, 32, 64)]
    stored = load_profile(runs.parent.parent.parent / "scripts" / "planner" / "profiles" / "h200-qwen3-0.6b.json")
    assert ratios == sorted(ratios) and 1.1 < ratios[0] < ratios[-1] < 1.35
    assert stored.mps_cost("decode").alone == pytest.approx(sum(ratios) / len(ratios), abs=0.005)


def test_a_plan_of_one_gpu_weighs_colocating_against_sharing_it_in_turns_and_under_mps():
    """`--gpus 1`: one colocated engine, or 1P:1D at half the GPU each, time-sliced or under MPS, each policy. With
    a profile whose roles slow nothing under MPS, the MPS layout is the pair on a GPU each at half the blocks, so
    its first tokens come sooner than in turns; the pick is one of them and is drawn again like any other."""
    from scripts.planner.config import PlanConfig
    from scripts.planner.plan import redraw, run_plan

    cfg = PlanConfig(profile="p.json", gpus=1, rates="4,12", num_requests=60, disagg_policies="always,auto", seed=0)
    plan = run_plan(cfg, [mps_profile(prefill=0.0, decode=0.0)])
    assert set(plan.results) == {"colocated x1", "1P:1D (0.5 GPU each)", "1P:1D (0.5 GPU each under MPS)",
                                 "1P:1D (auto, 0.5 GPU each)", "1P:1D (auto, 0.5 GPU each under MPS)"}
    turns, mps = plan.results["1P:1D (0.5 GPU each)"], plan.results["1P:1D (0.5 GPU each under MPS)"]
    assert all(m.ttft_p50 < t.ttft_p50 for t, m in zip(turns, mps))
    assert [p.rate for p in mps] == [4.0, 12.0] and all(p.requests == 60 for p in mps)
    again = redraw(plan, "1P:1D (0.5 GPU each under MPS)", seed=0)
    assert [(p.ttft_p50, p.tpot_p90, p.goodput) for p in again] == [(p.ttft_p50, p.tpot_p90, p.goodput) for p in mps]
    assert plan.routers[1] == {"disagg": 1, "colocated": 1}
    with pytest.raises(ValueError, match="--gpus"):
        PlanConfig(profile="p.json", gpus=0)


def test_plan_command_of_one_gpu_recommends_one_of_its_layouts():
    from tests.test_planner import plan_command

    proc = plan_command("--gpus", "1", "--rates", "2", "--num-requests", "30", "--disagg-policies", "always")
    assert proc.returncode == 0, proc.stderr
    assert "\n1 GPU; SLO:" in proc.stdout and "between GPUs go over" not in proc.stdout
    [line] = [line for line in proc.stdout.splitlines() if line.startswith("recommendation: ")]
    assert any(line.startswith(f"recommendation: {name}: ") for name in
               ("colocated x1", "1P:1D (0.5 GPU each)", "1P:1D (0.5 GPU each under MPS)"))


def test_engines_sharing_a_gpu_are_one_shard_behind_one_router_and_take_that_gpus_share_of_the_rate():
    from scripts.planner.shards import shards_of

    shared = Layout(prefill=1, decode=1, gpus_per_engine=0.5, mps=True)
    assert shards_of(shared, 1) == {shared: 1} and shared.num_gpus == 1
    assert Layout(prefill=3, decode=5).num_gpus == 8 and Layout(colocated=4, gpus_per_engine=0.5).num_gpus == 2
    with pytest.raises(ValueError, match="not split among routers"):
        shards_of(shared, 2)
