"""Engines sharing a GPU in the planner's simulator (scripts/planner/gpu.py): one step at a time on the GPU, first
come first served, each engine with its memory share of the KV blocks; fast-forward agrees with stepping."""
from __future__ import annotations

import pytest

from scripts.planner.gpu import pack
from scripts.planner.sim import Layout, Simulation, Workload, simulate
from tests.test_planner import make_profile, workload


def test_engines_are_packed_onto_gpus_in_launch_order():
    assert pack([0.5] * 4) == [0, 0, 1, 1]
    assert pack([1.0] * 3) == [0, 1, 2]
    assert pack([0.3] * 4) == [0, 0, 0, 1]
    assert Layout(prefill=1, decode=1, gpus_per_engine=0.5).gpus() == [0, 0]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_two_engines_on_one_gpu_take_turns_step_by_step(fast_forward):
    """Two colocated replicas on one GPU, one request each, both at 0: the prefills run one after the other, then
    the decode steps alternate, so each request's times are sums of the other's steps too."""
    profile = make_profile()
    prompt, output = 300, 20
    load = Workload([0.0, 0.0], [list(range(prompt)), list(range(10_000, 10_000 + prompt))], [output] * 2,
                    shared_prefixes=False)
    launch = profile.host_launch_s
    prefill = launch + profile.prefill.seconds(prompt, 0)
    decodes = [launch + profile.decode.seconds(1, prompt + i) for i in range(output - 1)]

    alone = simulate(profile, Layout(colocated=2), load, fast_forward=fast_forward)
    assert [r.first for r in alone] == pytest.approx([prefill, prefill], rel=1e-12)
    assert [r.done for r in alone] == pytest.approx([prefill + sum(decodes)] * 2, rel=1e-12)

    shared = simulate(profile, Layout(colocated=2, gpus_per_engine=0.5), load, fast_forward=fast_forward)
    assert sorted(r.first for r in shared) == pytest.approx([prefill, 2 * prefill], rel=1e-12)
    last = 2 * prefill + 2 * sum(decodes)  # the second engine's last step ends the alternation
    assert sorted(r.done for r in shared) == pytest.approx([last - decodes[-1], last], rel=1e-12)


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
