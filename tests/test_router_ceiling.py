"""The planner's router check (scripts/planner/router_ceiling.py): one router's ceiling falls as workers are added,
a rate beyond it is reported with the fewest routers that carry it, and `pdcluster plan` says so."""
from __future__ import annotations

import json
import math

import pytest

from scripts.planner.router_ceiling import MEASURED, UTILIZATION, RouterCost, check, routers_needed
from tests.test_planner import plan_command


@pytest.mark.parametrize("mode", sorted(MEASURED))
def test_the_measured_ceiling_falls_as_workers_are_added(mode):
    ceilings = [MEASURED[mode].ceiling(n) for n in (1, 10, 100, 1000, 10000)]
    assert all(c > 0 for c in ceilings[:-1])
    assert ceilings == sorted(ceilings, reverse=True) and ceilings[0] > 2 * ceilings[3]


@pytest.mark.parametrize("mode", sorted(MEASURED))
def test_streamed_tokens_lower_the_ceiling_by_their_cpu(mode):
    cost = MEASURED[mode]
    plain, streamed = cost.ceiling(10), cost.ceiling(10, tokens=300)
    assert streamed == pytest.approx(plain * (cost.base_s + 10 * cost.per_worker_s)
                                     / (cost.base_s + 10 * cost.per_worker_s + 300 * cost.per_token_s))
    assert streamed < plain / 5  # 300 streamed tokens cost the router more than the request around them
    rate = 0.9 * cost.ceiling(100)
    assert check(mode, 100, rate).routers == 1
    streams = check(mode, 100, rate, tokens=300)
    assert streams.exceeded and streams.routers is not None and streams.routers > 5
    assert "of 300 streamed tokens" in streams.advice()


def test_heartbeats_alone_can_fill_a_router():
    cost = RouterCost(base_s=1e-3, per_worker_s=0.0, heartbeat_share=0.01)
    assert cost.ceiling(50) == pytest.approx(500 * UTILIZATION) and cost.ceiling(100) == 0 == cost.ceiling(200)
    assert routers_needed(1.0, 200, cost.ceiling) == 3  # 67 workers each leave a third of a core


@pytest.mark.parametrize("mode, workers", [("disagg", 8), ("colocated", 128), ("disagg", 1000)])
def test_a_rate_beyond_one_router_gets_the_fewest_routers_that_carry_it(mode, workers):
    ceiling = MEASURED[mode].ceiling
    below = check(mode, workers, 0.9 * ceiling(workers))
    assert not below.exceeded and below.routers == 1
    rate = 3.5 * ceiling(workers)
    over = check(mode, workers, rate)
    k = over.routers
    assert over.exceeded and k is not None and 1 < k <= 4  # fewer workers each: each router places faster
    assert k * ceiling(math.ceil(workers / k)) >= rate > (k - 1) * ceiling(math.ceil(workers / (k - 1)))
    assert f"{k} routers" in over.advice() and f"{math.ceil(workers / k)} workers" in over.advice()


def test_a_given_router_rate_holds_whatever_the_workers():
    c = check("disagg", 1000, 250, router_rps=100)
    assert c.exceeded and c.ceiling == 100 and c.routers == 3
    assert check("disagg", 2, 250, router_rps=100).routers is None  # one router per worker is not enough
    assert not check("disagg", 1000, 250, router_rps=300).exceeded


def test_plan_puts_the_routers_a_rate_needs_in_front_and_says_when_told_fewer(tmp_path):
    flags = ("--gpus", "4", "--rates", "2,8", "--num-requests", "60", "--disagg-policies", "always",
             "--router-rps", "5")
    proc = plan_command(*flags, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("router: ")]
    assert len(lines) == 2 and all("2 routers, each in front of about 2 workers" in line
                                   and "carry every rate here" in line for line in lines)
    assert "routers: disagg layouts behind 2 routers, each in front of 2 engines" in proc.stdout
    record = json.loads((tmp_path / "plan.json").read_text())
    assert {(c["mode"], c["rate"], c["used"], c["exceeded"]) for c in record["router"]} == {
        (m, r, 2, False) for m in ("colocated", "disagg") for r in (2, 8)}
    assert "1P:3D" not in record["results"] and "2P:2D" in record["results"]  # a router each needs a prefill worker
    forced = plan_command(*flags, "--routers", "1")
    assert forced.returncode == 0, forced.stderr[-3000:]
    lines = [line for line in forced.stdout.splitlines() if line.startswith("router: ")]
    assert len(lines) == 2 and all("8 req/s" in line and "2 routers carry it" in line for line in lines)
    quiet = plan_command("--gpus", "4", "--rates", "2", "--num-requests", "60", "--disagg-policies", "always",
                         "--output-len", "40")
    assert quiet.returncode == 0 and "router: one router carries every rate here" in quiet.stdout
    assert "req/s of 40 streamed tokens" in quiet.stdout  # the workload's output length, as the bench streams it
