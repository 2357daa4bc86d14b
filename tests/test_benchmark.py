"""scripts/benchmark.py (and bench_config, bench_server, bench_metrics, bench_workloads, bench_report): metrics,
workloads, traces and the report without a cluster, then a CPU smoke run."""
from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scripts import bench_hardware as H
from scripts import bench_plots, bench_report, bench_server, bench_slo, benchmark
from scripts import bench_workloads as W
from scripts.bench_metrics import SLO, Dist, RequestRecord, percentile, summarize
from scripts.bench_plots import PLOTS
from scripts.bench_report import markdown, write_report
from scripts.benchmark import (UNLOADED, BenchConfig, LoadPoint, arrivals, bench_cluster, build_requests, load_points,
                               point_requests, run_benchmark, run_point)
from scripts.cli import main as cli_main

ROOT = Path(__file__).resolve().parent.parent


def record(i: int, start: float, ttft: float, e2e: float, tokens: int = 4, asked: int = 4, **kw) -> RequestRecord:
    gap = (e2e - ttft) / max(1, tokens - 1)
    return RequestRecord(index=i, prompt_len=10, output_len=asked, start=start, end=start + e2e, ttft=ttft,
                         itl=[gap] * (tokens - 1), output_tokens=tokens, finish_reason="length", **kw)


def failed(i: int, start: float, end: float, code: str = "overloaded") -> RequestRecord:
    return RequestRecord(index=i, prompt_len=10, output_len=4, start=start, end=end, error_code=code,
                         error=f"{code}: no room")


# ---- metrics ------------------------------------------------------------------------------------
@given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=200))
def test_percentiles_match_numpy_and_are_ordered(values):
    got = [percentile(values, q) for q in (50, 90, 99)]
    assert got == pytest.approx([np.percentile(values, q) for q in (50, 90, 99)], rel=1e-9, abs=1e-9)
    assert min(values) <= got[0] <= got[1] <= got[2] <= max(values)


def test_percentile_and_dist_of_nothing_are_none():
    assert percentile([], 50) is None
    assert Dist.of([]) == Dist(None, None, None, None)
    assert Dist.of([2.0]) == Dist(2.0, 2.0, 2.0, 2.0)


def test_tpot_excludes_the_first_token():
    r = record(0, start=1.0, ttft=0.5, e2e=2.0, tokens=4)
    assert r.e2e == pytest.approx(2.0) and r.tpot == pytest.approx(0.5)
    assert record(1, 0.0, 0.1, 0.1, tokens=1, asked=1).tpot is None
    assert failed(2, 0.0, 1.0).tpot is None


def test_summary_counts_failures_and_goodput_needs_both_slos():
    slo = SLO(ttft=1.0, tpot=0.1)
    records = [
        record(0, 0.0, ttft=0.2, e2e=0.5),            # meets both
        record(1, 1.0, ttft=1.5, e2e=1.8),            # TTFT too slow
        record(2, 2.0, ttft=0.2, e2e=1.4),            # TPOT 0.4 s: too slow
        record(3, 3.0, ttft=0.1, e2e=0.1, tokens=1, asked=1),  # one token: no TPOT to miss
        record(4, 4.0, ttft=0.2, e2e=0.3, tokens=3),  # finished short of what was asked
        failed(5, 5.0, 10.0),
        failed(6, 6.0, 6.5, code="client_timeout"),
    ]
    s = summarize(records, slo)
    assert (s.requests, s.completed, s.failed, s.wrong_length) == (7, 5, 2, 1)
    assert s.errors == {"overloaded": 1, "client_timeout": 1}
    assert s.duration == pytest.approx(10.0)  # the failed request's end counts too
    assert s.request_throughput == pytest.approx(0.5)
    assert s.output_throughput == pytest.approx((4 + 4 + 4 + 1 + 3) / 10)
    assert s.input_throughput == pytest.approx(5 * 10 / 10)
    assert s.goodput == pytest.approx(3 / 10) and s.slo_attainment == pytest.approx(3 / 7)
    assert s.ttft.p50 == pytest.approx(0.2) and s.ttft.mean == pytest.approx((0.2 + 1.5 + 0.2 + 0.1 + 0.2) / 5)
    assert s.tpot.p99 == pytest.approx(percentile([0.1, 0.1, 0.4, 0.1], 99))
    assert len(records[0].itl) == 3 and s.itl.p50 is not None
    assert s.e2e.p50 == pytest.approx(0.5)


def test_the_ttft_outside_the_router_is_each_requests_ttft_less_the_routers_own():
    records = [record(0, 0.0, ttft=0.030, e2e=0.5, router_ttft=0.020), record(1, 0.1, ttft=0.210, e2e=0.5,
               router_ttft=0.010), record(2, 0.2, ttft=0.050, e2e=0.5)]  # the last without the router's timings
    s = summarize(records, SLO(1.0, 0.1))
    assert s.outside_ttft.mean == pytest.approx(0.105) and s.outside_ttft.p50 == pytest.approx(0.105)
    cell = bench_report.outside_ttft(asdict(s))
    assert cell == f"105.0 / {1e3 * percentile([0.010, 0.200], 99):.1f}"
    assert bench_report.outside_ttft({"ttft": {}}) == "n/a"  # results from before it was kept


def test_summary_of_only_failures_has_no_latencies():
    s = summarize([failed(0, 0.0, 1.0)], SLO(1.0, 0.1))
    assert (s.completed, s.failed, s.goodput, s.slo_attainment) == (0, 1, 0.0, 0.0)
    assert s.ttft == s.tpot == s.itl == s.e2e == Dist(None, None, None, None)


# ---- workloads ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,span", [("64", (64, 64)), ("100:1024", (100, 1024)), (" 7:7 ", (7, 7))])
def test_length_range_parses(text, span):
    r = W.LengthRange.parse(text)
    assert (r.lo, r.hi) == span and W.LengthRange.parse(str(r)) == r


@pytest.mark.parametrize("text", ["0", "5:3", "abc", "1:2:3", "", "-4", "3:"])
def test_length_range_refuses(text):
    with pytest.raises(ValueError, match="LO"):
        W.LengthRange.parse(text)


def test_random_requests_are_seeded_and_in_range():
    ins, outs = W.LengthRange(100, 200), W.LengthRange(5, 5)
    a = W.random_requests(random.Random(1), 50, 512, ins, outs)
    assert a == W.random_requests(random.Random(1), 50, 512, ins, outs)
    assert a != W.random_requests(random.Random(2), 50, 512, ins, outs)
    assert all(100 <= len(r.prompt_ids) <= 200 and r.output_len == 5 and r.arrival is None for r in a)
    assert all(0 <= t < 512 for r in a for t in r.prompt_ids)
    assert len({len(r.prompt_ids) for r in a}) > 10


@pytest.mark.parametrize("vocab", [1, 2, 255, 256, 257, 151936, 2**31 + 1, 2**32 - 1, 2**32 + 5])
def test_random_prompts_are_the_ids_randrange_draws(vocab):
    """Batched draws give what one randrange an id gives from the same state, and leave the generator where it would
    (earlier runs' workloads, recorded only by their seed, stay the same)."""
    for seed, length in [(0, 0), (1, 1), (2, 37), (3, 4096)]:
        a, b = random.Random(seed), random.Random(seed)
        assert W.random_prompt(a, length, vocab) == [b.randrange(vocab) for _ in range(length)]
        assert a.random() == b.random()
    with pytest.raises(ValueError, match="vocabulary of 0"):
        W.random_prompt(random.Random(0), 5, 0)


@pytest.mark.parametrize("vocab", [1, 2, 257, 151936, 2**32 + 5])
def test_stand_in_prompts_leave_the_generator_where_drawn_ids_do(vocab):
    """The planner draws prompts that share no block without their ids: as many stand-ins, after the same draws."""
    for seed, length in [(0, 0), (1, 1), (2, 37), (3, 4096)]:
        a, b = random.Random(seed), random.Random(seed)
        assert W.random_prompt(a, length, vocab, ids=False) == [0] * len(W.random_prompt(b, length, vocab))
        assert a.random() == b.random()


@pytest.mark.parametrize("workload", ["random", "long-short", "shared-prefix"])
def test_a_load_point_drawn_without_ids_has_the_lengths_and_arrivals_of_one_drawn_with_them(workload):
    """What the planner simulates of the bench's load points: the same lengths, outputs and arrival times; a
    shared-prefix workload keeps its ids (its blocks are shared by them)."""
    cfg = BenchConfig(out="unused", model="unused", workload=workload, rates="20", input_len="50:300",
                      output_len="4:40", prefix_len=64, num_requests=60)
    point = LoadPoint("rate", 20.0)
    real, stand = point_requests(cfg, 0, 60, 1000, None), point_requests(cfg, 0, 60, 1000, None, ids=False)
    assert [(len(r.prompt_ids), r.output_len) for r in stand] == [(len(r.prompt_ids), r.output_len) for r in real]
    assert arrivals(cfg, point, 0, stand) == arrivals(cfg, point, 0, real)
    if workload == "shared-prefix":
        assert [r.prompt_ids for r in stand] == [r.prompt_ids for r in real]
    else:
        assert all(set(r.prompt_ids) == {0} for r in stand) and any(set(r.prompt_ids) != {0} for r in real)


def test_long_short_mix_has_the_exact_share_of_long_requests():
    reqs = W.long_short_mix(random.Random(0), 40, 1000, W.LengthRange(50, 60), W.LengthRange(30, 30),
                            W.LengthRange(900, 900), W.LengthRange(2, 2), 0.25)
    longs = [r for r in reqs if len(r.prompt_ids) == 900]
    assert len(longs) == 10 and all(r.output_len == 2 for r in longs)
    assert all(50 <= len(r.prompt_ids) <= 60 and r.output_len == 30 for r in reqs if r not in longs)
    assert reqs.index(longs[0]) != 0 or reqs.index(longs[-1]) != 9  # spread, not all first


def test_shared_prefix_mix_reuses_few_system_prompts():
    reqs = W.shared_prefix_mix(random.Random(0), 30, 1000, 64, 3, W.LengthRange(8, 16), W.LengthRange(4, 4))
    prefixes = {tuple(r.prompt_ids[:64]) for r in reqs}
    assert len(prefixes) <= 3 and len(prefixes) >= 2
    assert all(72 <= len(r.prompt_ids) <= 80 for r in reqs)


def test_poisson_arrivals_have_the_asked_rate():
    times = W.poisson_arrivals(random.Random(0), 4000, 8.0)
    assert times == sorted(times) and times[0] > 0
    assert len(times) / times[-1] == pytest.approx(8.0, rel=0.05)
    assert W.poisson_arrivals(random.Random(0), 3, math.inf) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_arrivals_have_the_asked_rate_and_burstiness(cv):
    times = W.gamma_arrivals(random.Random(1), 20000, 4.0, cv)
    gaps = np.diff([0.0] + times)
    assert times == sorted(times) and (gaps >= 0).all()
    assert len(times) / times[-1] == pytest.approx(4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    assert W.gamma_arrivals(random.Random(1), 50, 4.0, cv) == W.gamma_arrivals(random.Random(1), 50, 4.0, cv)
    assert W.gamma_arrivals(random.Random(0), 3, math.inf, cv) == [0.0, 0.0, 0.0]


def test_bursty_arrivals_clump():
    """Same mean rate: with CV 3 more requests land within a tenth of the mean gap of the one before."""
    def close(times):
        return int((np.diff(times) < 0.1 / 4.0).sum())
    assert close(W.gamma_arrivals(random.Random(2), 4000, 4.0, 3.0)) > 3 * close(
        W.poisson_arrivals(random.Random(2), 4000, 4.0))


def test_prefixes_to_fill_fit_the_caches_together_but_not_one():
    n = W.prefixes_to_fill(cache_tokens=10_000, workers=2, prefix_len=1024)
    assert n * 1024 > 10_000 and n * 1024 <= 2 * 10_000
    assert W.prefixes_to_fill(10_000, 4, 1024) > n
    for workers, prefix in ((1, 1024), (2, 9_000)):
        with pytest.raises(ValueError, match="together but not one"):
            W.prefixes_to_fill(10_000, workers, prefix)


def test_shared_prefix_workload_sized_from_the_cache(tmp_path):
    cfg = config(tmp_path, workload="shared-prefix", prefix_len=64, prefix_cache_tokens=256, prefill_workers=3,
                 input_len="8", output_len="2")
    assert cfg.prefix_count() == W.prefixes_to_fill(256, 3, 64) == 9
    reqs = build_requests(cfg, random.Random(0), 200, 100, None)
    prefixes = {tuple(r.prompt_ids[:64]) for r in reqs}
    assert 256 < len(prefixes) * 64 <= 3 * 256 and len(prefixes) == 9
    assert "one of 9 system prompts" in benchmark.describe_workload(cfg, 200)
    with pytest.raises(ValueError, match="--prefix-cache-tokens"):
        config(tmp_path, workload="shared-prefix", prefix_len=64, prefix_cache_tokens=256, prefill_workers=1)


def test_gamma_load_points_use_gamma_arrivals(tmp_path):
    cfg = config(tmp_path, arrivals="gamma", burstiness=2.5)
    reqs = [W.BenchRequest([1], 1)] * 6
    expected = W.gamma_arrivals(random.Random(f"{cfg.seed}:1:arrivals"), 6, 3.0, 2.5)
    assert arrivals(cfg, LoadPoint("rate", 3.0), 1, reqs) == expected
    assert "gamma arrivals, CV 2.5" in benchmark.describe_workload(cfg, 6)


def test_mode_variants_pick_the_routers_placement(tmp_path):
    cfg = config(tmp_path, modes="disagg:prefix,disagg:load,colocated")
    assert cfg.mode_list() == ["disagg:prefix", "disagg:load", "colocated"]
    commands = {m: bench_server.serve_command(cfg, m, "tcp://127.0.0.1:1") for m in cfg.mode_list()}
    assert commands["disagg:load"][commands["disagg:load"].index("--mode") + 1] == "disagg"
    assert commands["disagg:load"][commands["disagg:load"].index("--placement") + 1] == "load"
    assert commands["disagg:prefix"][commands["disagg:prefix"].index("--placement") + 1] == "prefix"
    assert "--placement" not in commands["colocated"]
    both = bench_server.serve_command(config(tmp_path, modes="disagg:auto+load"), "disagg:auto+load", "tcp://x:1")
    assert both[both.index("--disagg-policy") + 1] == "auto" and both[both.index("--placement") + 1] == "load"
    for bad in ("colocated:auto", "disagg:auto+never", "disagg:load+prefix", "disagg:auto+"):
        if bad == "disagg:auto+":  # an empty variant is no variant
            config(tmp_path, modes=bad)
            continue
        with pytest.raises(ValueError, match="--modes"):
            config(tmp_path, modes=bad)


# ---- traces -------------------------------------------------------------------------------------
TRACE = ['{"arrival": 2.5, "input_len": 30, "output_len": 4, "user": "b"}', "",
         '{"arrival": 0.5, "input_len": 10, "output_len": 2}',
         '{"arrival": 4.5, "input_len": 20, "output_len": 1}']


def test_trace_parses_sorted_and_replays_from_zero():
    entries = W.parse_trace(TRACE)
    assert [e.arrival for e in entries] == [0.5, 2.5, 4.5]
    reqs = W.trace_requests(random.Random(0), entries, 100)
    assert [(len(r.prompt_ids), r.output_len, r.arrival) for r in reqs] == [(10, 2, 0.0), (30, 4, 2.0), (20, 1, 4.0)]
    assert W.trace_rate([0.5, 2.5, 4.5]) == pytest.approx(0.5)
    assert W.scale_arrivals([0.5, 2.5, 4.5], 2.0) == pytest.approx([0.0, 0.5, 1.0])
    assert W.scale_arrivals([1.0, 1.0], 2.0) == [0.0, 0.0]


@pytest.mark.parametrize("line,problem", [
    ("{not json", "line 2: not JSON"),
    ("[1, 2, 3]", "line 2: expected an object"),
    ('{"arrival": 1, "input_len": 5}', "line 2: missing output_len"),
    ('{"arrival": -1, "input_len": 5, "output_len": 1}', "line 2: arrival must be"),
    ('{"arrival": "soon", "input_len": 5, "output_len": 1}', "line 2: arrival must be"),
    ('{"arrival": 1, "input_len": 0, "output_len": 1}', "line 2: input_len must be an integer >= 1, got 0"),
    ('{"arrival": 1, "input_len": 5, "output_len": 2.5}', "line 2: output_len must be an integer"),
    ('{"arrival": 1, "input_len": true, "output_len": 1}', "line 2: input_len must be an integer"),
])
def test_a_bad_trace_line_is_named(line, problem):
    with pytest.raises(W.TraceError, match=f"^my.jsonl {problem}"):
        W.parse_trace([TRACE[0], line], source="my.jsonl")


def test_an_empty_or_missing_trace_is_an_error(tmp_path):
    with pytest.raises(W.TraceError, match="no requests"):
        W.parse_trace(["", "  "])
    with pytest.raises(W.TraceError, match="cannot read"):
        W.read_trace(tmp_path / "nope.jsonl")


# The schema of Azure's public LLM inference traces (the Splitwise paper's code and conversation traces)
CODE_CSV = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:03.9799600,4808,10",
            "2023-11-16 18:17:05.5000000,110,27", "2023-11-16 18:17:09,300,5"]
CONV_CSV = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:17:01.0000000,1020,129",
            "2023-11-16 18:17:04.2500000,207,54", "2023-11-16 18:17:07.7500000,2734,424",
            "2023-11-16 18:17:11.0000000,500,60"]


def write_lines(path, lines) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_csv_trace_in_azures_schema_reads_with_its_timestamps():
    entries = W.parse_csv_trace(CODE_CSV, "code.csv")
    assert [(e.input_len, e.output_len) for e in entries] == [(4808, 10), (110, 27), (300, 5)]
    # seven fraction digits, or none
    assert [e.arrival - entries[0].arrival for e in entries] == pytest.approx([0.0, 1.52004, 5.02004])
    assert entries[0].arrival == pytest.approx(1700158623.97996)  # POSIX seconds, UTC


def test_csv_traces_merge_over_the_span_they_share_and_replay_from_a_start(tmp_path):
    code, conv = write_lines(tmp_path / "code.csv", CODE_CSV), write_lines(tmp_path / "conv.csv", CONV_CSV)
    merged = W.read_trace(f"{code},{conv}")
    # conv's first request came before code's first and its last after code's last: both are left out
    assert [(e.input_len, e.output_len) for e in merged] == [(4808, 10), (207, 54), (110, 27), (2734, 424),
                                                             (300, 5)]
    later = W.read_trace(f"{code},{conv}", start=1.0)
    assert [e.input_len for e in later] == [110, 2734, 300]  # 1 s after the first of the merge, on
    reqs = W.trace_requests(random.Random(0), later, 100)
    assert [r.arrival for r in reqs] == pytest.approx([0.0, 2.25, 3.5])
    with pytest.raises(W.TraceError, match="nothing 60 s in"):
        W.read_trace(code, start=60)
    jsonl = write_lines(tmp_path / "t.jsonl", TRACE)
    with pytest.raises(W.TraceError, match="no common clock"):
        W.read_trace(f"{code},{jsonl}")


@pytest.mark.parametrize("line,problem", [
    ("2023-11-16 18:17:03.5,12", "line 2: expected TIMESTAMP,ContextTokens,GeneratedTokens"),
    ("16/11/2023 18:17:03,12,5", "line 2: TIMESTAMP must be"),
    ("2023-11-16 18:17:03.x,12,5", "line 2: TIMESTAMP must be"),
    ("2023-11-16 18:17:03,0,5", "line 2: ContextTokens must be an integer >= 1, got '0'"),
    ("2023-11-16 18:17:03,12,-1", "line 2: GeneratedTokens must be an integer >= 1"),
])
def test_a_bad_csv_trace_line_is_named(line, problem):
    with pytest.raises(W.TraceError, match=f"^code.csv {problem}"):
        W.parse_csv_trace([CODE_CSV[0], line], "code.csv")


def test_a_trace_start_needs_a_trace_and_is_not_negative(tmp_path):
    with pytest.raises(ValueError, match="--trace-start"):
        config(tmp_path, trace_start=5.0)
    with pytest.raises(ValueError, match="--trace-start"):
        config(tmp_path, workload="trace", trace="t.jsonl", trace_start=-1.0)
    assert config(tmp_path, workload="trace", trace="t.jsonl", trace_start=2.0).trace_start == 2.0


def test_bench_reports_a_bad_trace_line_in_one_line(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(TRACE[0] + "\n" + '{"arrival": 1, "input_len": "x", "output_len": 1}\n')
    code = cli_main(["bench", "--model", str(tmp_path), "--vocab-size", "100", "--workload", "trace",
                     "--trace", str(trace), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err == f"pdcluster: error: {trace} line 2: input_len must be an integer >= 1, got 'x'"


# ---- configuration, load points -----------------------------------------------------------------
@pytest.mark.parametrize("flags,problem", [
    (["--rates", "1", "--concurrency", "2"], "not both"),
    (["--rates", "1,fast"], "--rates: expected numbers"),
    (["--rates", "0"], "--rates: must be > 0"),
    (["--concurrency", "0"], "--concurrency: must be >= 1"),
    (["--modes", "disagg,pipelined"], "--modes: expected disagg and/or colocated"),
    (["--workload", "trace"], "--trace FILE goes with --workload trace"),
    (["--input-len", "9:3"], "--input-len: expected 1 <= LO <= HI"),
    (["--slo-tpot", "0"], "--slo-tpot: must be > 0"),
    (["--unloaded-requests", "-1"], "--unloaded-requests: must be >= 0, got -1"),
    (["--modes", "disagg:fastest"], "--modes: expected disagg and/or colocated"),
    (["--arrivals", "weibull"], "--arrivals: expected one of poisson, gamma"),
    (["--burstiness", "0"], "--burstiness: must be a finite number > 0"),
    (["--slo-scale", "0"], "--slo-scale: must be > 0"),
    (["--device", "gpu"], "--device: expected one of auto, cpu, cuda, got 'gpu'"),
])
def test_bad_flags_exit_2_with_one_line(flags, problem, tmp_path, capsys):
    assert cli_main(["bench", "--model", str(tmp_path), "--out", str(tmp_path / "o"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and problem in err
    assert not (tmp_path / "o").exists()


def test_model_or_address_is_required(tmp_path, capsys):
    assert cli_main(["bench", "--out", str(tmp_path)]) == 2
    assert "--model is required" in capsys.readouterr().err


def config(tmp_path: Path, **kw) -> BenchConfig:
    return BenchConfig(out=str(tmp_path), model=str(tmp_path), vocab_size=100, **kw)


def test_unloaded_requests_default_to_8_and_0_skips_them(tmp_path):
    assert config(tmp_path).unloaded_requests == 8
    assert config(tmp_path, unloaded_requests=0).unloaded_requests == 0
    with pytest.raises(ValueError, match="--unloaded-requests: must be >= 0"):
        config(tmp_path, unloaded_requests=-2)


def test_load_points_and_arrivals(tmp_path):
    cfg = config(tmp_path, input_len="4", output_len="2")
    assert [p.label for p in load_points(cfg, None)] == ["1 req/s", "2 req/s", "4 req/s", "8 req/s"]
    closed = config(tmp_path, concurrency="1,4")
    assert load_points(closed, None) == [LoadPoint("concurrency", 1), LoadPoint("concurrency", 4)]
    reqs = build_requests(cfg, random.Random(0), 5, 100, None)
    inf = LoadPoint("rate", math.inf)
    assert arrivals(cfg, inf, 0, reqs) == [0.0] * 5 and inf.to_json()["value"] is None
    assert arrivals(cfg, LoadPoint("rate", 2), 0, reqs) == arrivals(cfg, LoadPoint("rate", 2), 0, reqs)

    trace = W.parse_trace(TRACE)
    tcfg = config(tmp_path, workload="trace", trace="t.jsonl")
    (point,) = load_points(tcfg, trace)
    assert point.kind == "trace" and point.value == pytest.approx(0.5)
    treqs = build_requests(tcfg, random.Random(0), 2, 100, trace)
    assert arrivals(tcfg, point, 0, treqs) == [0.0, 2.0]
    scaled = config(tmp_path, workload="trace", trace="t.jsonl", rates="4")
    assert load_points(scaled, trace) == [LoadPoint("rate", 4.0)]
    assert arrivals(scaled, LoadPoint("rate", 4.0), 0, treqs) == pytest.approx([0.0, 0.25])


# ---- the load generator against a fake cluster --------------------------------------------------
@pytest.fixture(autouse=True)
def no_heartbeat_wait(monkeypatch):
    """Fake clusters answer stats at once: no heartbeats to wait for."""
    monkeypatch.setattr(bench_server, "HEARTBEAT_WAIT_S", 0.0)



class FakeStream:
    def __init__(self, client: FakeClient, prompt_len: int, n: int, fail: bool):
        self.client, self.prompt_len, self.n, self.fail, self.result = client, prompt_len, n, fail, None

    async def __aiter__(self):
        from router.client import Completion, Delta, ServerError, Timings, Usage

        self.client.in_flight += 1
        self.client.peak = max(self.client.peak, self.client.in_flight)
        self.client.events.append(("start", self.prompt_len))
        try:
            await asyncio.sleep(0.01)
            if self.fail:
                raise ServerError("overloaded", "queue full", retry_after=1.0)
            for i in range(self.n):
                yield Delta(request_id="r", token_ids=[7], text="x", index=i)
                await asyncio.sleep(0.002)
            self.client.tokens += self.n
            usage = Usage(prompt_tokens=1, completion_tokens=self.n, cached_tokens=0)
            self.result = Completion("r", "x" * self.n, [7] * self.n, "length", usage,
                                     Timings(queued=0.0005, ttft=0.001, e2e=0.002 * self.n, itl=[],
                                             reserved=0.0007))
        finally:
            self.client.in_flight -= 1
            self.client.events.append(("end", self.prompt_len))


class FakeClient:
    def __init__(self):
        self.sent: list[tuple[float, int]] = []
        self.events: list[tuple[str, int]] = []  # ("start" or "end", prompt length), in order
        self.in_flight = self.peak = self.tokens = 0

    def stream(self, prompt_ids, *, timeout, max_tokens, **sampling):
        assert sampling == {"ignore_eos": True, "temperature": 0.0}
        self.sent.append((time.perf_counter(), len(prompt_ids)))
        return FakeStream(self, len(prompt_ids), max_tokens, fail=len(prompt_ids) == 13)


class FakeCluster(FakeClient):
    """What bench_cluster opens as `AsyncClient(address)`: ready at once."""

    async def __aenter__(self) -> FakeCluster:
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    async def wait_ready(self, timeout: float) -> None:
        pass

    async def stats(self, timeout: float | None = None):
        """One decode worker whose engine ran a step of one token for each token streamed so far."""
        from types import SimpleNamespace

        worker = SimpleNamespace(worker_id="d0", role="decode", busy_steps=self.tokens,
                                 busy_seconds=0.002 * self.tokens,
                                 prefill_tokens_run=0, decode_tokens_run=self.tokens)
        return SimpleNamespace(workers=[worker])


class Bar:
    n = 0

    def update(self, k: int) -> None:
        self.n += k


def test_open_loop_sends_on_time_and_records_failures():
    client, bar = FakeClient(), Bar()
    reqs = [W.BenchRequest([1] * n, 3) for n in (5, 13, 6, 7)]
    times = [0.0, 0.05, 0.1, 0.1]
    t0 = time.perf_counter()
    records = asyncio.run(run_point(client, LoadPoint("rate", 20), reqs, times, 5.0, bar))
    sent = [t - t0 for t, _ in client.sent]
    assert sent == pytest.approx(times, abs=0.03)
    assert [r.index for r in records] == [0, 1, 2, 3] and bar.n == 4
    assert [r.ok for r in records] == [True, False, True, True]
    assert records[1].error_code == "overloaded" and "queue full" in records[1].error
    ok = records[0]
    assert ok.output_tokens == 3 and len(ok.itl) == 2 and 0 < ok.ttft < ok.e2e and ok.tpot > 0
    assert (ok.router_queued, ok.router_reserved, ok.router_ttft) == (0.0005, 0.0007, 0.001)  # the router's Timings
    assert records[1].router_ttft is None  # a failure has no answer to read them from


def test_ttft_is_timed_at_the_client_from_the_send_to_the_first_streamed_token() -> None:
    """TTFT is what the client waits: prefill, transfer, decode queue and first step, and its own side too. The fake
    stream's first token comes 10 ms after the send; the router's own figure (1 ms) must not stand in for it."""
    client = FakeClient()
    (rec,) = asyncio.run(run_point(client, LoadPoint("rate", 20), [W.BenchRequest([1] * 5, 3)], [0.0], 5.0, Bar()))
    assert rec.ok and rec.router_ttft == pytest.approx(0.001)
    assert 0.01 <= rec.ttft < rec.e2e
    assert rec.e2e - rec.ttft >= 2 * 0.002  # the two tokens after the first are not in it


def test_closed_loop_keeps_concurrency_requests_in_flight():
    client, bar = FakeClient(), Bar()
    reqs = [W.BenchRequest([1] * 5, 2) for _ in range(9)]
    records = asyncio.run(run_point(client, LoadPoint("concurrency", 3), reqs, None, 5.0, bar))
    assert client.peak == 3 and [r.index for r in records] == list(range(9)) and all(r.ok for r in records)


def test_unloaded_requests_go_one_at_a_time_between_warm_up_and_load_points(tmp_path, monkeypatch, capsys):
    import router.client

    client = FakeCluster()
    monkeypatch.setattr(router.client, "AsyncClient", lambda address: client)
    # prompt lengths tell the phases apart: 3 warm-up, 4 unloaded, 5 load points
    warmup = [W.BenchRequest([1] * 3, 2) for _ in range(3)]
    unloaded = [W.BenchRequest([1] * 4, 3) for _ in range(4)]
    points = [LoadPoint("rate", math.inf), LoadPoint("concurrency", 3)]
    workloads = [[W.BenchRequest([1] * 5, 2) for _ in range(6)] for _ in points]
    run = {"mode": "disagg", "address": "tcp://fake", "warmup": None, "unloaded": None, "points": []}
    asyncio.run(bench_cluster(config(tmp_path), run, None, points, workloads, warmup, unloaded))

    lens = [n for _, n in client.events]
    first = lens.index(4)
    assert client.events[first:first + 8] == [("start", 4), ("end", 4)] * 4  # each ends before the next starts
    assert set(lens[:first]) == {3} and set(lens[first + 8:]) == {5}  # nothing else in flight meanwhile
    assert client.peak > 1  # the load points do overlap

    u = run["unloaded"]
    assert u["load"] == UNLOADED.to_json() == LoadPoint("concurrency", 1).to_json()
    assert (u["summary"]["requests"], u["summary"]["completed"], len(u["requests"])) == (4, 4, 4)
    assert u["summary"]["tpot"]["p50"] > 0
    assert [p["load"]["label"] for p in run["points"]] == ["all at once", "concurrency 3"]
    assert capsys.readouterr().out.splitlines()[0].split()[:3] == ["disagg", "unloaded", "4/4"]


def test_each_point_records_what_the_engines_ran_during_it(tmp_path, monkeypatch):
    """Engine totals are cumulative; a point keeps the differences over its own span only."""
    import router.client

    client = FakeCluster()
    monkeypatch.setattr(router.client, "AsyncClient", lambda address: client)
    points = [LoadPoint("concurrency", 2), LoadPoint("rate", math.inf)]
    workloads = [[W.BenchRequest([1] * 5, 2)] * 6, [W.BenchRequest([1] * 5, 4)] * 3]
    run = {"mode": "disagg", "address": "tcp://fake", "warmup": None, "unloaded": None, "points": []}
    warmup, unloaded = [W.BenchRequest([1] * 3, 7)], [W.BenchRequest([1] * 4, 5)] * 2
    asyncio.run(bench_cluster(config(tmp_path), run, None, points, workloads, warmup, unloaded))
    ran = [r["engines"] for r in (run["unloaded"], *run["points"])]
    assert [[(e["worker_id"], e["role"], e["busy_steps"], e["decode_tokens_run"]) for e in r] for r in ran] == [
        [("d0", "decode", 10, 10)], [("d0", "decode", 12, 12)], [("d0", "decode", 12, 12)]]
    assert ran[1][0]["busy_seconds"] == pytest.approx(0.024)


def test_report_shows_the_decode_engines_step_and_batch():
    point = {"summary": {"duration": 2.0}, "engines": [
        {"worker_id": "p0", "role": "prefill", "busy_steps": 50, "busy_seconds": 1.9, "prefill_tokens_run": 9000,
         "decode_tokens_run": 0},
        {"worker_id": "d0", "role": "decode", "busy_steps": 300, "busy_seconds": 1.5, "prefill_tokens_run": 0,
         "decode_tokens_run": 3000, "gpu_seconds": 1.4},
        {"worker_id": "d1", "role": "decode", "busy_steps": 100, "busy_seconds": 0.5, "prefill_tokens_run": 0,
         "decode_tokens_run": 600, "gpu_seconds": 0.2}]}
    engines = bench_report.decode_engines(point)  # prefill workers left out
    assert engines == pytest.approx({"step_ms": 5.0, "batch": 9.0, "busy": 0.5, "gpu_busy": 0.4})
    rows = dict(bench_report.engine_rows([point, None]))
    assert rows == {"decode step, mean (ms)": ["5.00", "n/a"], "decode tokens per busy step, mean": ["9.00", "n/a"],
                    "decode engines busy": ["50%", "n/a"], "decode GPUs busy (CUDA events)": ["40%", "n/a"]}
    for e in point["engines"]:  # CPU workers, or results from before GPU times were kept
        e.pop("gpu_seconds", None)
    assert bench_report.decode_engines(point)["gpu_busy"] is None
    assert bench_report.engine_rows([{"summary": {"duration": 1.0}}, None]) == []  # results from before the totals


def engines(hit: int, asked: int) -> list[dict]:
    return [{"worker_id": "p0", "role": "prefill", "prefix_query_tokens": asked, "prefix_hit_tokens": hit},
            {"worker_id": "d0", "role": "decode", "prefix_query_tokens": 0, "prefix_hit_tokens": 0}]


def test_report_shows_the_prefix_cache_hit_rate_and_reads_the_placement_target():
    from scripts import bench_placement

    def point(hit: int, ttft: float) -> dict:
        return {"summary": {"ttft": {"p50": ttft}}, "engines": engines(hit, 1000)}
    assert bench_placement.hit_rate(point(300, 1.0)) == pytest.approx(0.3)
    assert bench_placement.hit_rate({"summary": {}}) is None  # results from before the totals
    assert bench_placement.hit_rate_rows([point(300, 1.0), None]) == [("prefix cache hit rate", ["30.0%", "n/a"])]
    load_points = [{"label": "1 req/s"}, {"label": "2 req/s"}]
    results = {"load_points": load_points, "runs": [
        {"mode": "disagg:prefix", "points": [point(600, 0.1), point(500, 0.2)]},
        {"mode": "disagg:load", "points": [point(300, 0.2), point(300, 0.3)]}]}
    assert "meets the target at every load point" in bench_placement.placement_reading(results)
    results["runs"][0]["points"][1] = point(400, 0.2)  # 1.33x the hit rate: short of 1.5x
    assert "misses the target at 2 req/s: hit rate 40.0% vs 30.0%" in bench_placement.placement_reading(results)
    assert bench_placement.placement_reading({"load_points": load_points, "runs": results["runs"][:1]}) is None


def test_points_keep_the_kv_handoffs_by_transport_and_the_report_shows_them():
    from types import SimpleNamespace

    from scripts import bench_report

    def stats(ipc: tuple, nccl: tuple | None):
        handoffs = [SimpleNamespace(transport="cuda_ipc", count=ipc[0], bytes=ipc[1], seconds=ipc[2])]
        if nccl:
            handoffs.append(SimpleNamespace(transport="nccl", count=nccl[0], bytes=nccl[1], seconds=nccl[2]))
        workers = [SimpleNamespace(worker_id="p0", role="prefill", busy_steps=1, handoffs=handoffs),
                   SimpleNamespace(worker_id="d0", role="decode", busy_steps=1)]  # a decode worker sends none
        return SimpleNamespace(workers=workers, totals=None)

    class Stats:
        def __init__(self, *answers):
            self.answers = list(answers)

        async def stats(self, timeout=None):
            return self.answers.pop(0)

    monkey = Stats(stats((10, 1e9, 0.5), None), stats((30, 5e9, 1.5), (4, 4e9, 0.2)))
    before, after = asyncio.run(bench_server.engine_totals(monkey)), asyncio.run(bench_server.engine_totals(monkey))
    engines = bench_server.engine_activity(before, after)
    assert {e["worker_id"]: e["handoffs"] for e in engines} == {
        "p0": {"cuda_ipc": {"count": 20, "bytes": 4e9, "seconds": 1.0},
               "nccl": {"count": 4, "bytes": 4e9, "seconds": 0.2}},
        "d0": {}}
    rows = bench_report.handoff_rows([{"engines": engines}, {"engines": []}, None])
    assert rows == [(bench_report.HANDOFF_ROW, ["cuda_ipc 20 (50.0 ms, 4.0 GB/s); nccl 4 (50.0 ms, 20.0 GB/s)",
                                                "n/a", "n/a"])]
    assert bench_report.handoff_rows([{"engines": [{"role": "colocated", "busy_steps": 1}]}]) == []


def test_points_keep_the_routers_decisions_and_the_report_shows_them():
    from types import SimpleNamespace

    from scripts import bench_placement

    def stats(local: int, remote: int, migrations: int):
        worker = SimpleNamespace(worker_id="d0", role="decode", busy_steps=1)
        totals = SimpleNamespace(prompt_tokens=0, cached_tokens=0, migrations=migrations, local_prefills=local,
                                 remote_prefills=remote)
        return SimpleNamespace(workers=[worker], totals=totals)

    class Stats:
        def __init__(self, *answers):
            self.answers = list(answers)

        async def stats(self, timeout=None):
            return self.answers.pop(0)

    monkey = Stats(stats(2, 3, 0), stats(7, 13, 1))
    before, after = asyncio.run(bench_server.engine_totals(monkey)), asyncio.run(bench_server.engine_totals(monkey))
    assert [r["worker_id"] for r in bench_server.engine_activity(before, after)] == ["d0"]
    router = bench_server.router_activity(before, after)
    assert (router["local_prefills"], router["remote_prefills"], router["migrations"]) == (5, 10, 1)
    point = {"router": router}
    assert bench_placement.router_rows([point, None]) == [("prefilled on the decode worker", ["5 of 15", "n/a"]),
                                                          ("streams moved (migrations)", ["1", "n/a"])]
    assert bench_placement.router_rows([{"engines": []}]) == []  # results from before the router's totals
    assert bench_server.router_activity({"d0": {}}, {"d0": {}}) is None


def test_report_reads_whether_auto_disaggregation_wins():
    from scripts import bench_placement

    def point(ttft: float, goodput: float) -> dict:
        return {"summary": {"ttft": {"p50": ttft}, "goodput": goodput}}
    load_points = [{"label": "1 req/s"}, {"label": "2 req/s"}]
    results = {"load_points": load_points, "runs": [
        {"mode": "disagg:always", "points": [point(0.3, 1.0), point(0.5, 1.8)]},
        {"mode": "disagg:auto", "points": [point(0.1, 1.0), point(0.4, 1.9)]},
        {"mode": "colocated", "points": [point(0.12, 0.9), point(0.2, 1.2)]}]}
    reading = bench_placement.policy_reading(results)
    assert reading.startswith("`auto` wins at every load point")
    assert "- 1 req/s: TTFT p50 100.0 (auto) / 300.0 (always) / 120.0 (colocated) ms" in reading
    results["runs"][1]["points"][1] = point(0.4, 1.7)  # less goodput at 2 req/s
    assert bench_placement.policy_reading(results).startswith("`auto` does not win at 2 req/s")
    assert bench_placement.policy_reading({"load_points": load_points, "runs": results["runs"][2:]}) is None


def test_no_unloaded_requests_leave_no_unloaded_record(tmp_path, monkeypatch):
    import router.client

    client = FakeCluster()
    monkeypatch.setattr(router.client, "AsyncClient", lambda address: client)
    run = {"mode": "colocated", "address": "tcp://fake", "warmup": None, "unloaded": None, "points": []}
    point = LoadPoint("concurrency", 2)
    asyncio.run(bench_cluster(config(tmp_path), run, None, [point], [[W.BenchRequest([1] * 5, 2)] * 3], [], []))
    assert run["unloaded"] is None and len(run["points"]) == 1 and len(client.events) == 6


class FakeServe:
    def __init__(self, command: list[str], log_path: Path):
        pass

    def stop(self) -> int:
        return 0


def test_both_modes_get_the_same_unloaded_requests_from_their_own_seed(tmp_path, monkeypatch):
    given: dict[str, tuple] = {}

    async def fake_bench_cluster(cfg, run, server, points, workloads, warmup, unloaded, slo=None):
        given[run["mode"]] = (unloaded, warmup, workloads)

    monkeypatch.setattr(benchmark, "bench_cluster", fake_bench_cluster)
    monkeypatch.setattr(benchmark, "ServeProcess", FakeServe)
    monkeypatch.setattr(bench_report, "write_report", lambda out, results: [])
    cfg = config(tmp_path, unloaded_requests=3, input_len="8", output_len="2", rates="1,2", num_requests=5)
    results = run_benchmark(cfg)
    unloaded, warmup, workloads = given["disagg"]
    assert len(unloaded) == 3 and given["colocated"][0] == unloaded
    assert unloaded == build_requests(cfg, random.Random("0:unloaded"), 3, 100, None)
    assert all(unloaded != reqs[:3] for reqs in [warmup, *workloads])
    assert [run["unloaded"] for run in results["runs"]] == [None, None]  # until bench_cluster measures them


# ---- report -------------------------------------------------------------------------------------
def test_report_from_results_without_a_cluster(tmp_path):
    points = [LoadPoint("rate", 1.0), LoadPoint("rate", 4.0)]
    slo = SLO(0.5, 0.1)

    def point(p: LoadPoint, records: list[RequestRecord]) -> dict:
        return {"load": p.to_json(), "summary": asdict(summarize(records, slo)),
                "requests": [r.to_json() for r in records]}

    fast = [record(i, i * 0.5, 0.1 + 0.01 * i, 0.5) for i in range(6)]
    results = {
        "config": asdict(config(tmp_path, slo_ttft=0.5, slo_tpot=0.1)), "started": "now", "workload": "random",
        "address": None, "load_points": [p.to_json() for p in points],
        "runs": [
            {"mode": "disagg", "address": "a", "serve_command": ["pdcluster", "serve"], "error": None,
             "warmup": {"requests": 2, "failed": 0, "errors": []},
             "points": [point(points[0], fast), point(points[1], fast[:4] + [failed(4, 1, 2)])]},
            {"mode": "colocated", "address": "b", "serve_command": ["pdcluster", "serve"],
             "error": "serve exited with status 1 during 4 req/s", "warmup": {"requests": 2, "failed": 0},
             "points": [point(points[0], fast)]},
        ],
    }
    text = markdown(results)
    assert "| | disagg | colocated |" in text and "## 1 req/s" in text and "## 4 req/s" in text
    assert "| completed / failed | 4 / 1 | not run |" in text
    assert "1 x overloaded" in text and "serve exited with status 1" in text
    for path in write_report(tmp_path, results):
        assert path.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(PLOTS)


def measured(point: LoadPoint, tpot: float, n: int = 5, failures: int = 0) -> dict:
    """A load point's record where every request took `tpot` per token after the first."""
    records = [record(i, 0.5 * i, 0.1, 0.1 + 3 * tpot) for i in range(n)]
    records += [failed(n + i, 0.0, 1.0) for i in range(failures)]
    return {"load": point.to_json(), "summary": asdict(summarize(records, SLO(0.5, 0.05))),
            "requests": [r.to_json() for r in records]}


RATES = [LoadPoint("rate", r) for r in (1.0, 2.0, 4.0)]


def tpot_results(tmp_path: Path, tpots: dict[str, list[float]], unloaded: dict[str, float] | None) -> dict:
    """results.json as the benchmark writes it, TPOT SLO 50 ms; without `unloaded`, as it was written before it."""
    runs = []
    for mode, values in tpots.items():
        run = {"mode": mode, "address": "a", "serve_command": ["pdcluster", "serve"], "error": None,
               "warmup": {"requests": 2, "failed": 0, "errors": []},
               "points": [measured(p, t) for p, t in zip(RATES, values)]}
        if unloaded is not None:
            run["unloaded"] = measured(UNLOADED, unloaded[mode], n=4, failures=mode == "disagg")
        runs.append(run)
    cfg = asdict(config(tmp_path, slo_ttft=0.5, slo_tpot=0.05))
    if unloaded is None:
        del cfg["unloaded_requests"]
    return {"config": cfg, "started": "now", "workload": "random", "address": None,
            "load_points": [p.to_json() for p in RATES], "runs": runs}


def section(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if line]


@pytest.mark.parametrize("disagg_at_2,ratio,verdict", [(0.022, "1.10x", "within"), (0.03, "1.50x", "beyond")])
def test_report_reads_disagg_where_colocated_breaks_the_tpot_slo(tmp_path, disagg_at_2, ratio, verdict):
    results = tpot_results(tmp_path, {"disagg": [0.021, disagg_at_2, 0.04], "colocated": [0.03, 0.06, 0.1]},
                           unloaded={"disagg": 0.02, "colocated": 0.025})
    text = markdown(results)
    assert "then 8 unloaded requests, one at a time" in text
    assert section(text, "Unloaded reference")[1:] == [
        "| | disagg | colocated |", "|---|---:|---:|",
        "| requests | 5 | 4 |",
        "| completed / failed | 4 / 1 | 4 / 0 |",
        "| TTFT p50 (ms) | 100.0 | 100.0 |",
        "| TPOT p50 (ms) | 20.0 | 25.0 |",
        "| TPOT p90 (ms) | 20.0 | 25.0 |",
        "| ITL p50 (ms) | 20.0 | 25.0 |",
    ]
    assert "| TPOT p90 / unloaded TPOT p50 | 1.05x | 1.20x |" in section(text, "1 req/s")
    assert f"| TPOT p90 / unloaded TPOT p50 | {ratio} | 2.40x |" in section(text, "2 req/s")
    rows = section(text, "4 req/s")
    after_tpot = rows.index("| TPOT p99 (ms) | 40.0 | 100.0 |") + 1
    assert rows[after_tpot] == "| TPOT p90 / unloaded TPOT p50 | 2.00x | 4.00x |"
    assert section(text, "SLO reading")[1:] == [
        "Colocated TPOT p90 first exceeds the TPOT SLO (50 ms) at **2 req/s** (60.0 ms). There disagg TPOT p90 is "
        f"{disagg_at_2 * 1e3:.1f} ms, **{ratio}** its unloaded TPOT p50 (20.0 ms): {verdict} the 1.2x target."]
    assert "- **disagg**, unloaded: 1 x overloaded (e.g. 'overloaded: no room')" in section(text, "Failures")


def test_report_says_when_colocated_never_breaks_the_tpot_slo(tmp_path):
    results = tpot_results(tmp_path, {"disagg": [0.02, 0.02, 0.02], "colocated": [0.03, 0.04, 0.05]},
                           unloaded={"disagg": 0.02, "colocated": 0.025})
    assert section(markdown(results), "SLO reading")[1:] == [
        "Colocated TPOT p90 never exceeded the TPOT SLO (50 ms) in this run: there is no breaking rate to read "
        "disagg at."]
    results["runs"] = results["runs"][:1]
    assert section(markdown(results), "SLO reading")[1:] == [
        "No reading: it needs both modes, and this run has no colocated results."]


def test_slo_reading_takes_a_disagg_variant_when_plain_disagg_did_not_run(tmp_path):
    results = tpot_results(tmp_path, {"disagg": [0.02, 0.02, 0.02], "colocated": [0.03, 0.06, 0.1]},
                           unloaded={"disagg": 0.02, "colocated": 0.025})
    results["runs"][0]["mode"] = "disagg:always"
    reading = section(markdown(results), "SLO reading")[1]
    assert reading.startswith("Colocated TPOT p90 first exceeds the TPOT SLO (50 ms) at **2 req/s**")
    assert "There disagg:always TPOT p90 is 20.0 ms, **1.00x** its unloaded TPOT p50 (20.0 ms)" in reading


def test_old_results_without_unloaded_still_render(tmp_path, capsys):
    results = tpot_results(tmp_path, {"disagg": [0.02, 0.02, 0.02], "colocated": [0.03, 0.06, 0.1]}, unloaded=None)
    assert all("unloaded" not in run for run in results["runs"])
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert bench_report.main([str(path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "## Unloaded reference" not in text and "unloaded requests, one at a time" not in text
    assert "| TPOT p90 / unloaded TPOT p50 | n/a | n/a |" in section(text, "2 req/s")
    assert section(text, "SLO reading")[1].endswith(
        "at **2 req/s** (60.0 ms). Disagg has no unloaded TPOT to compare with (run with --unloaded-requests > 0), "
        "so the ratio cannot be read.")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == sorted(PLOTS)


# ---- the run's hardware, SLO and target, said in the report; plots without matplotlib ---------
def test_serve_commands_carry_only_the_flags_that_apply(tmp_path):
    cfg = config(tmp_path, gpus_per_worker=0.5, colocated_gpus_per_worker=1.0)
    cpu = bench_server.serve_command(cfg, "disagg", "tcp://127.0.0.1:1", "cpu")
    assert cpu[cpu.index("--device") + 1] == "cpu" and "--gpus-per-worker" not in cpu
    assert "--gpus-per-worker" not in bench_server.serve_command(cfg, "colocated", "tcp://127.0.0.1:1", "cpu")
    gpu = bench_server.serve_command(cfg, "disagg", "tcp://127.0.0.1:1", "cuda")
    assert gpu[gpu.index("--gpus-per-worker") + 1] == "0.5"
    colocated = bench_server.serve_command(cfg, "colocated", "tcp://127.0.0.1:1", "cuda")
    assert colocated[colocated.index("--gpus-per-worker") + 1] == "1"


def test_the_machine_is_found_and_each_mode_gets_its_share(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cpu = H.machine(config(tmp_path), gpus=[])
    assert (cpu["device"], cpu["cpu_cores"], H.label(cpu)) == ("cpu", 8, "CPU, 8 cores")
    gpu = H.machine(config(tmp_path), gpus=["NVIDIA H200", "NVIDIA H200"])
    assert gpu["device"] == "cuda" and H.label(gpu) == "2x NVIDIA H200"
    assert H.machine(config(tmp_path, device="cpu"), gpus=["NVIDIA H200"])["device"] == "cpu"  # asked for
    remote = H.machine(BenchConfig(out=str(tmp_path), address="tcp://h:5555", vocab_size=10))
    assert remote["device"] is None and H.mode_hardware(config(tmp_path), "disagg", remote) is None

    cfg = config(tmp_path)
    disagg, colocated = H.mode_hardware(cfg, "disagg", cpu), H.mode_hardware(cfg, "colocated", cpu)
    assert (disagg["processes"], disagg["threads_per_worker"]) == (2, 4)  # as the launcher splits the cores
    assert (colocated["processes"], colocated["threads_per_worker"]) == (1, 8)
    assert H.describe(disagg) == "1 prefill + 1 decode workers (2 processes), 4 threads each on 8 CPU cores"
    assert H.describe(colocated) == "1 colocated worker (1 process), 8 threads on 8 CPU cores"
    tp = H.mode_hardware(config(tmp_path, workers=2, serve_args="--tensor-parallel-size=2"), "colocated", gpu)
    assert (tp["processes"], tp["gpus"]) == (4, 4)


def test_a_mode_with_variants_gets_its_base_modes_hardware(tmp_path):
    cfg = config(tmp_path, prefill_workers=2, decode_workers=1, workers=3, gpus_per_worker=0.5,
                 colocated_gpus_per_worker=1.0)
    m = H.machine(cfg, gpus=["NVIDIA H100"])
    auto = H.mode_hardware(cfg, "disagg:auto+load", m)
    assert auto["workers"] == {"prefill": 2, "decode": 1} and auto["gpus_per_worker"] == 0.5
    assert H.mode_hardware(cfg, "colocated:load", m)["workers"] == {"colocated": 3}


@pytest.mark.parametrize("flags,device,note", [
    ({}, "cpu", "Not the same number of engines: on the same 8 CPU cores, disagg runs 2 worker processes (4 threads "
                "each) and colocated 1 (8 threads each), so the comparison is also one of 2 engines against 1; for as "
                "many colocated workers as disagg has, add --workers 2."),
    ({"workers": 2}, "cpu", "Equal hardware: both modes run 2 worker processes on the same 8 CPU cores, 4 threads "
                            "each."),
    ({"gpus_per_worker": 0.5, "colocated_gpus_per_worker": 1.0}, "cuda",
     "Equal hardware: both modes have 1 GPU in all, disagg's split over 2 worker processes and colocated's over 1."),
    ({"workers": 2}, "cuda", "Equal hardware: both modes have 2 GPUs in all."),
    ({}, "cuda", "Not equal hardware: disagg has 2 GPUs and colocated 1 GPU, so the comparison is also one of 2 GPUs "
                 "against 1 GPU; for equal hardware give colocated 2 GPUs in all (--workers and "
                 "--colocated-gpus-per-worker)."),
])
def test_one_sentence_says_whether_the_modes_had_equal_hardware(tmp_path, monkeypatch, flags, device, note):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cfg = config(tmp_path, **flags)
    m = H.machine(cfg, gpus=["NVIDIA H100"] * 2 if device == "cuda" else [])
    assert H.comparison_note({mode: H.mode_hardware(cfg, mode, m) for mode in ("disagg", "colocated")}) == note


def cpu_results(tmp_path: Path, tpot: float = 0.2, **flags) -> dict:
    """A CPU run on 2 cores as run_benchmark leaves it: every TPOT far above the GPU-sized 50 ms."""
    cfg = config(tmp_path, **flags)
    results = tpot_results(tmp_path, {"disagg": [tpot] * 3, "colocated": [tpot * 1.1] * 3},
                           unloaded={"disagg": tpot, "colocated": tpot})
    results["config"] = asdict(cfg)
    results["machine"] = {"device": "cpu", "gpus": [], "cpu_cores": 2, "cpu_model": None, "local": True}
    for run in results["runs"]:
        run["hardware"] = H.mode_hardware(cfg, run["mode"], results["machine"])
    results["slo"] = bench_slo.settle(cfg, "cpu", results["runs"])
    bench_slo.rejudge(results, results["slo"])
    return results


def test_on_cpu_the_slo_is_a_multiple_of_the_unloaded_p50_and_flags_win(tmp_path):
    cfg = config(tmp_path)
    assert bench_slo.known_before(cfg, "cpu") is None  # waits for the unloaded requests
    assert bench_slo.known_before(cfg, "cuda") == SLO(1.0, 0.05)
    assert bench_slo.known_before(config(tmp_path, slo_ttft=2.0, slo_tpot=0.3), "cpu") == SLO(2.0, 0.3)

    results = cpu_results(tmp_path)
    slo = bench_slo.settle(cfg, "cpu", results["runs"])
    assert slo["ttft"] == pytest.approx(5 * 0.1) and slo["tpot"] == pytest.approx(5 * 0.2)
    assert "--slo-scale 5 x disagg's unloaded TPOT p50 (200.0 ms" in slo["tpot_from"]
    mixed = bench_slo.settle(config(tmp_path, slo_tpot=0.3, slo_scale=2), "cpu", results["runs"])
    assert (mixed["ttft"], mixed["tpot"], mixed["tpot_from"]) == (pytest.approx(0.2), 0.3, "--slo-tpot")
    assert bench_slo.settle(cfg, "cuda", results["runs"])["tpot"] == 0.05
    none = bench_slo.settle(cfg, "cpu", [{**run, "unloaded": None} for run in results["runs"]])
    assert none["tpot"] == 0.05 and "no unloaded TPOT to derive it from" in none["tpot_from"]


def test_goodput_on_cpu_is_judged_by_the_derived_slo_and_the_report_says_so(tmp_path):
    results = cpu_results(tmp_path)
    del results["slo"]
    bench_slo.rejudge(results, bench_slo.settle(config(tmp_path), "cuda", results["runs"]))
    assert all(p["summary"]["goodput"] == 0 for run in results["runs"] for p in run["points"])  # GPU-sized: 0.00
    results["slo"] = bench_slo.settle(config(tmp_path), "cpu", results["runs"])
    bench_slo.rejudge(results, results["slo"])
    assert all(p["summary"]["slo_attainment"] == 1.0 for run in results["runs"] for p in run["points"])
    text = markdown(results)
    assert "- SLO: TTFT <= 500 ms and TPOT <= 1000 ms" in text
    assert "  - TPOT SLO: on CPU: --slo-scale 5 x disagg's unloaded TPOT p50 (200.0 ms, the slower mode's)" in text
    assert "- hardware: CPU, 2 cores" in text


def test_the_report_states_each_modes_hardware_beside_the_comparison(tmp_path):
    text = markdown(cpu_results(tmp_path))
    clusters = section(text, "Clusters")
    assert "**disagg**: 1 prefill + 1 decode workers (2 processes), 1 thread each on 2 CPU cores" in clusters
    assert "**colocated**: 1 colocated worker (1 process), 2 threads on 2 CPU cores" in clusters
    assert clusters[-1].startswith("Not the same number of engines") and clusters[-1] in section(text, "SLO reading")
    equal = markdown(cpu_results(tmp_path, workers=2))
    assert section(equal, "Clusters")[-1].startswith("Equal hardware")
    assert not any(line.startswith("Equal") for line in section(equal, "SLO reading"))


def test_the_tpot_ratio_target_is_defined_and_can_be_set(tmp_path):
    results = tpot_results(tmp_path, {"disagg": [0.021, 0.03, 0.04], "colocated": [0.03, 0.06, 0.1]},
                           unloaded={"disagg": 0.02, "colocated": 0.025})
    definition, reading = section(markdown(results), "SLO reading")[:2]
    assert "within 1.2x of its unloaded TPOT p50" in definition and "this project's design goal" in definition
    assert reading.endswith("**1.50x** its unloaded TPOT p50 (20.0 ms): beyond the 1.2x target.")
    results["config"]["tpot_ratio_target"] = 1.6
    definition, reading = section(markdown(results), "SLO reading")[:2]
    assert "within 1.6x" in definition and reading.endswith("within the 1.6x target.")
    with pytest.raises(ValueError, match="--tpot-ratio-target: must be > 0"):
        config(tmp_path, tpot_ratio_target=0)


def test_the_decode_tokens_per_step_row_is_explained_where_it_reads_below_one(tmp_path):
    results = cpu_results(tmp_path)
    # one request at a time, 16-token answers: 15 decode tokens, 16 busy steps (the last only collects)
    results["runs"][0]["unloaded"]["engines"] = [{"worker_id": "d0", "role": "decode", "busy_steps": 16,
                                                   "busy_seconds": 0.16, "prefill_tokens_run": 0,
                                                   "decode_tokens_run": 15}]
    unloaded = section(markdown(results), "Unloaded reference")
    assert "| decode tokens per busy step, mean | 0.94 | n/a |" in unloaded
    assert not any("GPUs busy" in line for line in unloaded)  # no CUDA times on CPU: no row of n/a
    assert unloaded[-1] == bench_report.BATCH_NOTE and "just under 1" in unloaded[-1]


def test_plot_titles_name_the_model_and_the_hardware(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    results = cpu_results(tmp_path)
    results["config"]["model"] = "/models/qwen3-0.6b"
    assert bench_plots.title(results) == "qwen3-0.6b on CPU, 2 cores"
    results["machine"] = {"device": "cuda", "gpus": ["NVIDIA H200"], "cpu_cores": 64, "cpu_model": None,
                          "local": True}
    assert bench_plots.title(results) == "qwen3-0.6b on NVIDIA H200"
    titles = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: titles.append(fig._suptitle.get_text()))
    bench_plots.write_plots(tmp_path, results, bench_slo.of_results(results))
    assert titles == ["qwen3-0.6b on NVIDIA H200"] * len(PLOTS)


def test_without_matplotlib_the_report_is_written_and_says_how_to_get_plots(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    paths = write_report(tmp_path, cpu_results(tmp_path))
    assert paths == [tmp_path / "report.md"] and not list(tmp_path.glob("*.png"))
    note = capsys.readouterr().err.strip()
    assert len(note.splitlines()) == 1 and "plots skipped" in note and "pip install matplotlib" in note
    plots = section((tmp_path / "report.md").read_text(), "Plots")
    assert len(plots) == 1 and "pip install matplotlib" in plots[0] and "[bench]" in plots[0]


def test_bench_without_matplotlib_exits_0_with_results_and_report(tmp_path, monkeypatch, capsys):
    async def fake_bench_cluster(cfg, run, server, points, workloads, warmup, unloaded, slo=None):
        assert slo is None  # on CPU without SLO flags: judged once the unloaded requests are in
        run["unloaded"] = measured(UNLOADED, 0.2)
        run["points"] = [measured(p, 0.25) for p in points]

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(H, "detect_gpus", lambda: [])
    monkeypatch.setattr(benchmark, "bench_cluster", fake_bench_cluster)
    monkeypatch.setattr(benchmark, "ServeProcess", FakeServe)
    out = tmp_path / "out"
    flags = ["--model", str(tmp_path), "--vocab-size", "100", "--rates", "1,2", "--out", str(out)]
    assert cli_main(["bench", *flags]) == 0
    results = json.loads((out / "results.json").read_text())
    assert (out / "report.md").is_file() and not list(out.glob("*.png"))
    assert results["machine"]["device"] == "cpu" and results["slo"]["tpot"] == pytest.approx(5 * 0.2)
    assert all(p["summary"]["goodput"] > 0 for run in results["runs"] for p in run["points"])
    for run in results["runs"]:
        assert "--gpus-per-worker" not in run["serve_command"] and "cpu" in run["serve_command"]
    out_text = capsys.readouterr()
    assert "SLO: TTFT <= 500.0 ms (on CPU" in out_text.out and "pip install matplotlib" in out_text.err


# ---- the real thing, on CPU ---------------------------------------------------------------------
@pytest.mark.slow
def test_cpu_smoke_run_of_both_modes(tiny_qwen3_dir, tmp_path):
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "scripts.cli", "bench", "--model", str(tiny_qwen3_dir), "--device", "cpu",
           "--modes", "disagg,colocated", "--rates", "2", "--num-requests", "12", "--input-len", "64",
           "--output-len", "16", "--unloaded-requests", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "report:" in proc.stdout and "%|" in proc.stderr  # the figures on stdout, a progress bar on stderr

    results = json.loads((out / "results.json").read_text())
    assert [run["mode"] for run in results["runs"]] == ["disagg", "colocated"]
    assert results["machine"]["device"] == "cpu" and results["slo"]["tpot_from"].startswith("on CPU: --slo-scale 5")
    for run in results["runs"]:
        assert run["error"] is None and run["warmup"] == {"requests": 4, "failed": 0, "errors": []}
        assert "--gpus-per-worker" not in run["serve_command"] and run["hardware"]["device"] == "cpu"
        unloaded = run["unloaded"]
        assert (unloaded["summary"]["requests"], unloaded["summary"]["completed"]) == (2, 2)
        assert all(r["error_code"] is None and r["output_tokens"] == 16 for r in unloaded["requests"])
        (point,) = run["points"]
        assert point["load"]["kind"] == "rate" and point["load"]["value"] == 2.0
        reqs, s = point["requests"], point["summary"]
        assert sorted(r["index"] for r in reqs) == list(range(12))
        assert all(r["error_code"] is None and r["output_tokens"] == 16 and r["prompt_len"] == 64 for r in reqs)
        assert (s["requests"], s["completed"], s["failed"], s["wrong_length"]) == (12, 12, 0, 0)
        for key in ("ttft", "tpot", "itl", "e2e", "router_ttft"):
            d = s[key]
            assert 0 < d["p50"] <= d["p90"] <= d["p99"], (key, d)
        # the router's clock starts after the client sends and sees the first token before the client does
        assert all(0 <= r["router_queued"] < r["router_ttft"] < r["ttft"] for r in reqs)
        if run["mode"] == "disagg":
            assert all(r["router_queued"] <= r["router_reserved"] < r["router_ttft"] for r in reqs)
        else:
            assert all(r["router_reserved"] is None for r in reqs)
        assert s["output_throughput"] == pytest.approx(12 * 16 / s["duration"])
        decoders = [e for e in point["engines"] if e["role"] in ("decode", "colocated")]
        # the first token of each request comes from its prefill; with overlap a step may run one more
        assert 12 * 15 <= sum(e["decode_tokens_run"] for e in decoders) <= 12 * 16
        assert sum(e["prefill_tokens_run"] for e in point["engines"]) == 12 * 64
        assert 0 < s["goodput"] <= s["request_throughput"]
        # on CPU every disaggregated prompt's KV goes through the host transport, each handoff acknowledged
        handoffs = [h for e in point["engines"] for h in e["handoffs"].items()]
        if run["mode"] == "disagg":
            assert [(t, h["count"]) for t, h in handoffs] == [("host", 12)] and handoffs[0][1]["bytes"] > 0
        else:
            assert handoffs == []
    report = (out / "report.md").read_text()
    assert ("| | disagg | colocated |" in report and "## 2 req/s" in report
            and "| decode tokens per busy step, mean |" in report)
    outside = next(line for line in report.splitlines() if line.startswith(f"| {bench_report.OUTSIDE_ROW} |"))
    assert "n/a" not in outside  # both modes' requests carry the router's timings
    assert f"| {bench_report.HANDOFF_ROW} | host 12 (" in report
    assert "Not the same number of engines" in report  # 2 worker processes against 1
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_records_from_before_the_router_timings_still_load():
    old = {"index": 3, "prompt_len": 5, "output_len": 2, "start": 0.1, "end": 0.3, "ttft": 0.05, "itl": [0.1],
           "output_tokens": 2, "finish_reason": "length", "error_code": None, "error": None, "e2e": 0.2, "tpot": 0.1}
    rec = RequestRecord.from_json(old)
    assert (rec.index, rec.ttft, rec.router_ttft, rec.router_queued) == (3, 0.05, None, None)
    assert RequestRecord.from_json(rec.to_json()) == rec


def test_a_point_records_the_bench_clients_own_stalls_and_says_so(tmp_path, monkeypatch, capsys):
    """A bench process that stalls (here: its loop held 150 ms) inflates the latencies it measures; each point keeps
    its client's loop stalls and full GCs, and the summary line names them."""
    import time

    import router.client
    from scripts import benchmark

    client = FakeCluster()
    monkeypatch.setattr(router.client, "AsyncClient", lambda address: client)
    run_point = benchmark.run_point

    async def stalling(*args, **kw):
        await asyncio.sleep(0.02)
        time.sleep(0.15)
        return await run_point(*args, **kw)

    monkeypatch.setattr(benchmark, "run_point", stalling)
    run = {"mode": "disagg", "address": "tcp://fake", "warmup": None, "unloaded": None, "points": []}
    asyncio.run(bench_cluster(config(tmp_path), run, None, [LoadPoint("concurrency", 2)],
                              [[W.BenchRequest([1] * 5, 2)] * 4], [], []))
    stalls = run["points"][0]["client"]
    assert stalls["loop_stalls"] >= 1 and 0.1 <= stalls["longest_loop_stall"] <= stalls["loop_stall_seconds"]
    assert "stalls: client" in capsys.readouterr().out


def test_a_point_whose_client_was_busy_says_so(tmp_path, monkeypatch, capsys):
    """A client whose process spent most of a point on its CPU queued the tokens it read, even where its loop gave
    every task its turn (no stall shows that): each point keeps its CPU share, and the summary line names a busy one.
    Here the process's CPU clock runs with the wall clock: busy throughout, whatever else the machine runs."""
    import time
    from types import SimpleNamespace

    import router.client
    from common import stalls
    from scripts import benchmark

    client = FakeCluster()
    monkeypatch.setattr(router.client, "AsyncClient", lambda address: client)
    monkeypatch.setattr(stalls, "time", SimpleNamespace(perf_counter=time.perf_counter, process_time=time.perf_counter))
    run = {"mode": "disagg", "address": "tcp://fake", "warmup": None, "unloaded": None, "points": []}
    asyncio.run(bench_cluster(config(tmp_path), run, None, [LoadPoint("concurrency", 2)],
                              [[W.BenchRequest([1] * 5, 2)] * 4], [], []))
    client_totals = run["points"][0]["client"]
    assert client_totals["cpu_busy"] > 0.99
    assert "client busy 100% of a core" in capsys.readouterr().out
    assert benchmark.stall_note({"client": {**client_totals, "cpu_busy": benchmark.CLIENT_BUSY / 2}}) == ""
