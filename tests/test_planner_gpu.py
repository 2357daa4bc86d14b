"""Engines sharing a GPU in the planner's simulator (scripts/planner/gpu.py): time-sliced (graph decode steps at
1/n of the GPU while n engines have steps in flight, eager launch-bound steps at their host's pace), each engine
with its memory share of the KV blocks; fast-forward agrees with stepping."""
from __future__ import annotations

import pytest

from scripts.planner.gpu import Gpu, pack
from scripts.planner.sim import Layout, Simulation, Workload, simulate
from tests.test_planner import make_profile, workload


def test_engines_are_packed_onto_gpus_in_launch_order():
    assert pack([0.5] * 4) == [0, 0, 1, 1]
    assert pack([1.0] * 3) == [0, 1, 2]
    assert pack([0.3] * 4) == [0, 0, 0, 1]
    assert Layout(prefill=1, decode=1, gpus_per_engine=0.5).gpus() == [0, 0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_two_engines_on_one_gpu_time_slice_it(fast_forward):
    """Two colocated replicas on one GPU, one request each, both at 0: their prefills are eager steps, launch-bound,
    and go at their hosts' pace side by side; then both decode at once, each decode step (a graph replay, GPU-bound)
    at half its pace alone, so every decode step takes twice as long as on a GPU of its own."""
    profile = make_profile()
    prompt, output = 300, 20
    load = Workload([0.0, 0.0], [list(range(prompt)), list(range(10_000, 10_000 + prompt))], [output] * 2,
                    shared_prefixes=False)
    launch = profile.host_launch_s
    prefill = launch + profile.prefill.seconds(prompt, 0)
    decodes = [launch + profile.decode.seconds(1, prompt + i) for i in range(output - 1)]

    alone = simulate(profile, Layout(colocated=2), load, fast_forward=fast_forward)
    assert [r.first for r in alone] == pytest.approx([prefill + launch] * 2, rel=1e-12)  # once the next launched
    assert [r.done for r in alone] == pytest.approx([prefill + sum(decodes)] * 2, rel=1e-12)

    shared = simulate(profile, Layout(colocated=2, gpus_per_engine=0.5), load, fast_forward=fast_forward)
    assert [r.first for r in shared] == pytest.approx([prefill + launch] * 2, rel=1e-12)
    assert [r.done for r in shared] == pytest.approx([prefill + 2 * sum(decodes)] * 2, rel=1e-12)


def test_a_decode_step_beside_an_eager_step_goes_at_half_pace_until_that_step_ends():
    """Processor sharing, by hand: a decode step of d seconds alone that starts while the other engine's eager
    step has e < d / 2 seconds left runs at half pace for e, then alone: it ends after e + (d - e / 2)."""
    gpu = Gpu(0, shared=True)
    prefill, decode = object(), object()
    gpu.add(prefill, 0.010, 0.0, host_paced=True)
    gpu.add(decode, 0.004, 0.009)  # the eager step has 1 ms left
    ends = gpu.ends(0.009)
    assert ends[prefill] == pytest.approx(0.010) and ends[decode] == pytest.approx(0.009 + 2 * 0.004)
    gpu.remove(prefill, 0.010)
    assert gpu.ends(0.010)[decode] == pytest.approx(0.010 + 0.004 - 0.001 / 2)


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
