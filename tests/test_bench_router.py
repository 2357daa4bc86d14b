"""scripts/bench_router.py's machinery on a tiny case: a real router in front of ten instant workers (colocated, and
disaggregated with the reserve / prefill_task / kv_handoff round played), open-loop load, the ceiling search, /proc
readings. Its figures are docs/benchmarks.md's; here only that every request is answered and every figure is one."""
from __future__ import annotations

import math

import pytest

from scripts import bench_router


@pytest.mark.slow  # about 15 s: two routers, their workers and load processes start
def test_the_bench_answers_every_request_and_reports_finite_figures(tiny_qwen3_dir, capsys):
    results = bench_router.main(["--model", str(tiny_qwen3_dir), "--workers", "10", "--modes", "colocated,disagg",
                                 "--step-seconds", "0.5", "--idle-seconds", "0.3", "--probe-rps", "100",
                                 "--max-steps", "1", "--bisect-steps", "0", "--max-p90-ms", "2000",
                                 "--fleet-processes", "2", "--clients", "1"])
    assert [(c.mode, c.workers) for c in results] == [("colocated", 10), ("disagg", 10)]
    for c in results:
        steps = [c.at_ceiling, *c.by_fraction.values()]
        assert all(s.unanswered == 0 and s.answered > 0 for s in steps)  # each one's requests all answered
        assert sum(s.answered for s in steps) >= 100
        per_step = (x for s in steps for x in (s.served_rps, s.p50_ms, s.p90_ms, s.p99_ms, s.cpu_ms, s.busy))
        figures = [c.rps, c.per_core, *per_step]
        assert all(math.isfinite(x) and x > 0 for x in figures), c
        assert 0 <= c.idle_cpu < 1 and c.rps >= 100
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("mode") and [line.split()[:2] for line in table[1:]] == [["colocated", "10"],
                                                                                        ["disagg", "10"]]


@pytest.mark.slow  # about 8 s
def test_streamed_answers_bring_every_token_as_a_delta(tiny_qwen3_dir, capsys):
    """--stream: the workers report one token an update and the router streams them; a load process counts a
    request answered only when its deltas carried every token."""
    (c,) = bench_router.main(["--model", str(tiny_qwen3_dir), "--workers", "2", "--modes", "disagg", "--stream",
                              "--tokens", "24", "--step-seconds", "0.5", "--idle-seconds", "0.3", "--probe-rps", "50",
                              "--max-steps", "1", "--bisect-steps", "0", "--max-p90-ms", "2000",
                              "--fleet-processes", "1", "--clients", "1"])
    steps = [c.at_ceiling, *c.by_fraction.values()]
    assert all(s.unanswered == 0 and s.answered > 0 for s in steps)
    assert all(math.isfinite(s.cpu_ms) and s.cpu_ms > 0 for s in steps)
