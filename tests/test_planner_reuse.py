"""What the planner computes once and reuses gives what computing it afresh gives: an engine's waiting prompts'
tokens between changes."""
from __future__ import annotations

import pytest

from scripts.planner.decode_pool import DecodePool
from scripts.planner.engine import SimEngine
from scripts.planner.layout import Layout
from scripts.planner.sim import Simulation
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
