"""What the planner computes once and reuses gives what computing it afresh gives: an engine's waiting prompts'
tokens between changes, and the router's check of a prompt a workload's simulations share."""
from __future__ import annotations

import pytest

import router.admission
from common.sampling_params import InvalidRequest
from scripts.planner.decode_pool import DecodePool
from scripts.planner.engine import SimEngine
from scripts.planner.layout import Layout
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
        sched = engine.scheduler
        pooled = isinstance(engine, DecodePool) and engine.pooled
        assert load.queued_tokens == (sched.waiting_tokens() if pooled else sched.queued_tokens())
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
