"""`pdcluster plan --validate`: a bench's results.json replayed through the simulator, predictions beside
measurements. The bench here is the real `run_benchmark` whose clusters are the simulator under a known profile
(the truth), so a replay with that profile must agree exactly, and one with a wrong profile must not."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import asdict
from dataclasses import replace as replace_layout
from pathlib import Path

import pytest
from msgspec.structs import replace

from scripts import bench_report, benchmark
from scripts.bench_metrics import SLO, summarize
from scripts.benchmark import BenchConfig, arrivals
from scripts.planner.profile import DecodeCost, Profile, save_profile
from scripts.planner.report import records
from scripts.planner.layout import Layout
from scripts.planner.sim import Simulation
from scripts.planner.workload import Workload
from scripts.planner.bench_replay import ValidationError
from scripts.planner.validate import METRICS, beyond, markdown, shifted, since, table, validate
from tests.test_planner import make_profile

ROOT = Path(__file__).resolve().parents[1]
RATES = (5.0, 20.0)
# What each mode of the bench below runs, written out by hand (the code under test maps it from the results)
LAYOUTS = {"disagg": Layout(prefill=1, decode=1, gpus_per_engine=0.5), "colocated": Layout(colocated=1),
           "disagg:auto": Layout(prefill=1, decode=1, policy="auto", gpus_per_engine=0.5)}


class FakeServe:
    def __init__(self, command: list[str], log_path: Path):
        pass

    def stop(self) -> int:
        return 0


def simulated_bench(tmp_path: Path, monkeypatch, truth: Profile, modes: str = "disagg,colocated",
                    late: float = 0.0, unloaded_requests: int = 0, transport: str | None = None,
                    **workload: object) -> dict:
    """`pdcluster bench` on one GPU (1P+1D at half a GPU each, one colocated replica on all of it), each cluster
    answering as the simulator does under `truth`, every token `late` seconds later, its KV handoffs over
    `transport` (recorded as the prefill worker records them; None: the profile's fastest, not recorded), on
    `workload` (bench flags; default: random lengths); returns results.json as written."""
    def layout(mode: str) -> Layout:
        return replace_layout(LAYOUTS[mode], transport=transport) if mode != "colocated" else LAYOUTS[mode]

    async def fake_cluster(cfg, run, server, points, workloads, warmup, unloaded, slo=None):
        """One cluster through the bench's phases, as bench_cluster serves them: the warm-up at once, the unloaded
        requests one at a time, then each load point at its send times, each once the one before has finished."""
        sends = [arrivals(cfg, point, i, requests) for i, (point, requests) in enumerate(zip(points, workloads))]
        before = warmup + unloaded
        every = before + [r for requests in workloads for r in requests]
        load = Workload([0.0] * len(before) + [t for times in sends for t in times], [r.prompt_ids for r in every],
                        [r.output_len for r in every], False,
                        phases=[len(warmup)] + [1] * len(unloaded) + [len(requests) for requests in workloads])
        sim = Simulation(truth, layout(run["mode"]), load)
        shifted(sim.run(), late)

        def phase(k: int) -> list:
            return since(sim.phase(k), sim.phase_starts[k])

        run["warmup"] = {"requests": len(warmup), "failed": 0, "errors": []}
        if unloaded:
            recs = records([r for k in range(1, 1 + len(unloaded)) for r in phase(k)])
            run["unloaded"] = {"load": {"label": "unloaded"}, "summary": asdict(summarize(recs, slo)),
                               "requests": [r.to_json() for r in recs]}
        for i, point in enumerate(points):
            k = 1 + len(unloaded) + i
            recs = records(phase(k))
            handoffs = {transport: {"count": len(recs), "bytes": 0, "seconds": 0.0}} if transport else {}
            engines = [{"worker_id": name, "role": e.role,
                        "busy_seconds": sim.phase_busy[k + 1][name] - sim.phase_busy[k][name],
                        "handoffs": handoffs if e.role == "prefill" else {}} for name, e in sim.engines.items()]
            run["points"].append({"load": point.to_json(), "summary": asdict(summarize(recs, slo)),
                                  "requests": [r.to_json() for r in recs], "engines": engines})

    monkeypatch.setattr(benchmark, "bench_cluster", fake_cluster)
    monkeypatch.setattr(benchmark, "ServeProcess", FakeServe)
    monkeypatch.setattr(benchmark, "machine", lambda cfg: {"device": "cuda", "gpus": ["GPU"], "cpu_cores": 2,
                                                           "cpu_model": None, "local": True})
    monkeypatch.setattr(bench_report, "write_report", lambda out, results: [])
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 5000}))
    cfg = BenchConfig(out=str(tmp_path / "bench"), model=str(model), modes=modes, device="cuda",
                      rates=",".join(map(str, RATES)), num_requests=150, input_len="100:400", output_len="20:60",
                      prefill_workers=1, decode_workers=1, gpus_per_worker=0.5, workers=1,
                      colocated_gpus_per_worker=1, slo_ttft=0.3, slo_tpot=0.02,
                      unloaded_requests=unloaded_requests, **workload)
    benchmark.run_benchmark(cfg)
    return json.loads((tmp_path / "bench" / "results.json").read_text())


def test_the_true_profile_predicts_the_bench_exactly(tmp_path, monkeypatch):
    truth = make_profile()
    results = simulated_bench(tmp_path, monkeypatch, truth, "disagg,colocated,disagg:auto")
    rows = validate(results, truth)
    assert [(r.mode, r.load) for r in rows] == [(m, f"{rate:g} req/s") for m in ("disagg", "colocated", "disagg:auto")
                                                 for rate in RATES]
    assert [r.layout for r in rows[::2]] == [str(layout) for layout in LAYOUTS.values()]
    for row in rows:
        for _, key in METRICS:
            assert row.error(key) == pytest.approx(0.0, abs=1e-9), (row.mode, row.load, key)
    # the heavier rate is a real test: requests wait, and not all meet the SLO
    assert rows[1].measured.ttft_p90 > 2 * rows[0].measured.ttft_p50
    # engines busy: beside the metrics where each engine has its GPU (colocated here), not where two share one
    assert [r.busy is None for r in rows] == [True, True, False, False, True, True]
    assert all(r.busy[0] == pytest.approx(r.busy[1], rel=1e-9) for r in rows if r.busy)
    text = table(rows)
    assert "!" not in text and text.count("(+0.0%)") == len(rows) * len(METRICS) + 2 and text.count("n/a") == 4


def test_a_fixed_delay_outside_the_steps_is_found_from_the_unloaded_requests(tmp_path, monkeypatch):
    """A cluster whose every token reaches the client 7 ms after the simulator's (messages): the unloaded
    requests show the offset, and the load points then agree exactly; without them, TTFT is off."""
    truth, late = make_profile(), 0.007
    results = simulated_bench(tmp_path, monkeypatch, truth, late=late, unloaded_requests=6)
    rows = validate(results, truth)
    for row in rows:
        assert row.offset_s == pytest.approx(late, abs=1e-9)
        for _, key in METRICS:
            assert row.error(key) == pytest.approx(0.0, abs=1e-9), (row.mode, row.load, key)
    assert "+7.0 ms" in table(rows)
    for run in results["runs"]:
        run["unloaded"] = None
    for row in validate(results, truth):
        assert row.offset_s == 0
        assert row.measured.ttft_p50 - row.predicted.ttft_p50 == pytest.approx(late, abs=1e-9)


def test_a_trace_runs_unloaded_requests_give_its_offset_too(tmp_path, monkeypatch):
    """The bench takes a trace run's unloaded requests from the trace's first lines: rebuilt the same way, they
    give its offset as for any workload."""
    trace = tmp_path / "trace.jsonl"
    rng = random.Random(3)
    trace.write_text("".join(json.dumps({"arrival": 0.05 * i, "input_len": rng.randint(100, 400),
                                         "output_len": rng.randint(20, 60)}) + "\n" for i in range(200)))
    truth, late = make_profile(), 0.007
    results = simulated_bench(tmp_path, monkeypatch, truth, "disagg", late=late, unloaded_requests=6,
                              workload="trace", trace=str(trace))
    rows = validate(results, truth)
    assert len(rows) == len(RATES)
    for row in rows:
        assert row.offset_s == pytest.approx(late, abs=1e-9)
        for _, key in METRICS:
            assert row.error(key) == pytest.approx(0.0, abs=1e-9), (row.load, key)


def test_a_wrong_profile_shows_large_errors_and_they_are_marked(tmp_path, monkeypatch):
    truth = make_profile()
    results = simulated_bench(tmp_path, monkeypatch, truth)
    wrong = replace(truth, decode=DecodeCost(base_s=3 * truth.decode.base_s, per_seq_s=truth.decode.per_seq_s))
    rows = validate(results, wrong)
    assert all(r.error("tpot_p50") > 0.5 for r in rows)
    # the colocated engine's steps cost more; where it saturates, fewer and larger steps hide part of it
    busy = [r.busy for r in rows if r.busy]
    assert len(busy) == 2 and busy[0][0] > 1.2 * busy[0][1] and busy[1][0] > busy[1][1]
    assert all(beyond(r, "tpot_p90", 0.15) for r in rows)
    marked = sum(beyond(r, k, 0.15) for r in rows for _, k in METRICS)
    assert table(rows).count("!") == marked
    md = markdown(rows, wrong, "results.json")
    assert md.count("**") == 2 * marked + 2  # each marked cell, and the legend's **bold**
    assert f"{marked} of {len(rows) * len(METRICS)} cells beyond" in md


def test_a_missed_cell_is_predicted_again_on_gpus_a_share_faster_or_slower_toward_the_measurement(tmp_path,
                                                                                                   monkeypatch):
    """`machine_reach`: a profile whose decode steps cost twice the served ones predicts TPOT high; each missed TPOT
    cell is predicted again on GPUs 10% faster (lower, nearer), and said under the table; cells within the tolerance
    are not."""
    from scripts.planner.validate import machine_reach, to_json

    truth = make_profile()
    results = simulated_bench(tmp_path, monkeypatch, truth)
    slow = replace(truth, decode=DecodeCost(base_s=2 * truth.decode.base_s, per_seq_s=truth.decode.per_seq_s))
    rows = validate(results, slow)
    machine_reach(results, slow, rows, 0.1)
    missed = [(i, k) for i, r in enumerate(rows) for k in ("ttft_p50", "ttft_p90", "tpot_p50", "tpot_p90")
              if beyond(r, k, 0.15)]
    assert ("tpot_p50" in {k for _, k in missed}) and all(rows[i].error(k) > 0 for i, k in missed)
    for i, row in enumerate(rows):
        assert set(row.reach) == {k for j, k in missed if j == i}
        for key, (share, value) in row.reach.items():
            assert share == -0.1 and getattr(row.measured, key) < value < getattr(row.predicted, key)
    assert validate(results, slow.slower(-0.1))[0].predicted.tpot_p50 == rows[0].reach["tpot_p50"][1]
    i, key = next((i, k) for i, k in missed if k == "tpot_p50")
    head = f"rank: {rows[i].mode} at {rows[i].load}, TPOT p50"
    line = next(n for n in table(rows).splitlines() if n.startswith(head))
    assert "; on GPUs 10% faster: " in line
    assert to_json(rows)[i]["metrics"][key]["machine"]["slower"] == -0.1
    assert all(m["machine"] is None for r in to_json(rows) for k, m in r["metrics"].items() if not m["beyond"])


def test_handoffs_are_costed_over_the_transport_the_run_took(tmp_path, monkeypatch):
    """A cluster whose handoffs went over nccl, slower than the profile's fastest (cuda_ipc): costed over nccl the
    prediction is exact; a profile with no nccl cost costs them over cuda_ipc, under-predicts TTFT (at the lighter
    rate by more than the tolerance) and says so."""
    from scripts.planner.profile import HandoffCost
    truth = make_profile(handoff={"cuda_ipc": HandoffCost(base_s=0.0005, bytes_per_s=1e11),
                                  "nccl": HandoffCost(base_s=0.02, bytes_per_s=1e9)})
    results = simulated_bench(tmp_path, monkeypatch, truth, "disagg", transport="nccl")
    rows = validate(results, truth)
    assert all(r.note == "" for r in rows)
    for row in rows:
        for _, key in METRICS:
            assert row.error(key) == pytest.approx(0.0, abs=1e-9), (row.load, key)
    no_nccl = replace(truth, handoff={"cuda_ipc": truth.handoff["cuda_ipc"]})
    rows = validate(results, no_nccl)
    assert rows[0].error("ttft_p50") < -0.15 and all(r.error("ttft_p50") < 0 for r in rows)  # 20 req/s: queueing
    assert all("went over nccl" in r.note and "costed as cuda_ipc" in r.note for r in rows)
    assert table(rows).count("note: disagg: the run's KV handoffs went over nccl") == 1
    assert "Note: disagg: the run's KV handoffs went over nccl" in markdown(rows, no_nccl, "results.json")


def test_results_whose_requests_cannot_be_rebuilt_are_refused(tmp_path, monkeypatch):
    truth = make_profile()
    results = simulated_bench(tmp_path, monkeypatch, truth, "colocated")
    assert results["vocab_size"] == 5000
    results["vocab_size"] = 7
    with pytest.raises(ValidationError, match="rebuilt requests differ"):
        validate(results, truth)


def test_plan_validate_prints_and_writes_the_table(tmp_path, monkeypatch):
    truth = make_profile()
    simulated_bench(tmp_path, monkeypatch, truth)
    save_profile(truth, tmp_path / "profile.json")
    command = [sys.executable, "-m", "scripts.cli", "plan", "--validate", str(tmp_path / "bench" / "results.json"),
               "--profile", str(tmp_path / "profile.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*command, "--out", str(tmp_path / "v")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TTFT p50" in proc.stdout and "goodput" in proc.stdout and "1P:1D (0.5 GPU each)" in proc.stdout
    record = json.loads((tmp_path / "v" / "validation.json").read_text())
    assert len(record["rows"]) == 4 and all(len(r["metrics"]) == len(METRICS) for r in record["rows"])
    assert (tmp_path / "v" / "validation.md").read_text().count("\n| ") == 1 + 4
    from scripts.bench_plots import missing
    plot = tmp_path / "v" / "validation.png"
    assert (plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n") if not missing() else not plot.exists()
    refused = subprocess.run([*command, "--rates", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 2 and "--rates" in refused.stderr
    # several results of one machine: a comma list, one table of all their modes
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    for i, run in enumerate(results["runs"]):
        (tmp_path / f"r{i}.json").write_text(json.dumps({**results, "runs": [run]}))
    command[5] = f"{tmp_path / 'r0.json'},{tmp_path / 'r1.json'}"
    both = subprocess.run([*command, "--out", str(tmp_path / "v2")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert both.returncode == 0, both.stderr[-3000:]
    assert json.loads((tmp_path / "v2" / "validation.json").read_text())["rows"] == record["rows"]
    command[5] += f",{tmp_path / 'none.json'}"
    missing_file = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert missing_file.returncode == 2 and "none.json" in missing_file.stderr


def test_a_plan_sees_the_requests_and_times_the_bench_sends(tmp_path, monkeypatch):
    """`pdcluster plan` with the bench's workload flags simulates the requests the bench sends, at its times."""
    from scripts.planner.config import PlanConfig
    from scripts.planner.plan import workloads

    sent: dict[int, tuple] = {}

    async def fake_cluster(cfg, run, server, points, loads, warmup, unloaded, slo=None):
        for i, (point, requests) in enumerate(zip(points, loads)):
            sent[i] = ([r.prompt_ids for r in requests], arrivals(cfg, point, i, requests))

    monkeypatch.setattr(benchmark, "bench_cluster", fake_cluster)
    monkeypatch.setattr(benchmark, "ServeProcess", FakeServe)
    monkeypatch.setattr(bench_report, "write_report", lambda out, results: [])
    flags = dict(rates="3,9", num_requests=40, input_len="10:90", output_len="5:9", workload="long-short", seed=4,
                 vocab_size=1000)
    benchmark.run_benchmark(BenchConfig(out=str(tmp_path), model=str(tmp_path), modes="colocated", device="cpu",
                                        unloaded_requests=0, **flags))
    planned = workloads(PlanConfig(profile="p.json", **flags))
    assert len(planned) == len(sent) == 2 and sent[0][0] != sent[1][0]
    for i, (rate, load) in enumerate(planned):  # prompts that share no block: their lengths (the ids stand-ins)
        assert ([len(p) for p in load.prompts], load.arrivals) == ([len(p) for p in sent[i][0]], sent[i][1])
        assert all(set(p) == {0} for p in load.prompts)


def test_a_path_no_unloaded_request_took_gets_the_other_runs_offset(tmp_path, monkeypatch):
    """Under `auto` the served router may prefill the unloaded requests on the decode worker (no reservation
    recorded) where the simulation sends them remote: such a pair says nothing of either path's offset. Validated
    beside an `always` run of the same machine, the mode's remote requests get that run's remote offset; alone, only
    its offset over all its unloaded requests."""
    truth, late = make_profile(), 0.007
    results = simulated_bench(tmp_path, monkeypatch, truth, "disagg,disagg:auto", late=late, unloaded_requests=6)
    for record in results["runs"][1]["unloaded"]["requests"]:  # served local: no reserve round trip, 5 ms sooner
        record.update(router_ttft=record["ttft"] - 0.005, router_reserved=None, ttft=record["ttft"] - 0.005)
    always, auto = ({**results, "runs": [run]} for run in results["runs"])
    for rows in (validate(results, truth)[len(RATES):], validate([always, auto], truth)[len(RATES):]):
        for row in rows:
            assert row.offset_s == pytest.approx(late - 0.005, abs=1e-9)
            assert row.borrowed == ("remote",) and row.offsets["remote"] == pytest.approx(late, abs=1e-9)
            assert row.predicted.ttft_p50 == pytest.approx(row.measured.ttft_p50, abs=1e-9), row.load
        assert "disagg:auto (1P:1D (auto, 0.5 GPU each); remote +7.0*" in table(rows)
        assert "its unloaded requests took no remote path" in table(rows)
    for row in validate(auto, truth):
        assert row.borrowed == ()
        assert row.measured.ttft_p50 - row.predicted.ttft_p50 == pytest.approx(0.005, abs=1e-9), row.load


def test_a_predictions_rank_is_the_percentile_it_is_of_the_measured_values():
    from scripts.bench_metrics import percentile
    from scripts.planner.validate import rank_of

    rng = random.Random(7)
    for n in (2, 5, 40, 101):
        values = sorted(rng.random() for _ in range(n))
        for q in (0, 12.5, 50, 90, 100):
            assert rank_of(values, percentile(values, q)) == pytest.approx(q)
    assert rank_of([1.0, 2.0, 2.0, 2.0, 3.0], 2.0) == 50  # the middle of a run of equal values
    assert (rank_of([5.0], 4.0), rank_of([5.0], 5.0), rank_of([5.0], 6.0)) == (0, 50, 100)


def test_a_p50_in_the_gap_between_two_groups_misses_in_value_and_its_rank_says_by_how_little():
    """Half the requests fast, half slow: the measured p50 lies between the groups. A prediction at the fast group's
    top is 74% off in value but the measured p49; the note under the table says so, with the wide p40-p60 span."""
    from scripts.bench_metrics import RequestRecord
    from scripts.planner.report import Point
    from scripts.planner.validate import Row, rank_cells, ranks

    fast = [0.010 + 0.0001 * i for i in range(50)]  # 10.0-14.9 ms
    slow = [0.100 + 0.001 * i for i in range(50)]  # 100-149 ms
    measured = [RequestRecord(i, 100, 8, 0.0, t + 0.035 + 0.0001 * i, ttft=t, itl=[0.005] * 7, output_tokens=8)
                for i, t in enumerate(fast + slow)]
    summary = summarize(measured, SLO(1.0, 0.05))
    assert summary.ttft.p50 == pytest.approx(0.05745)  # midway between 14.9 and 100 ms
    point = Point("1P:1D", 4.0, 100, 0.0149, 0.140, summary.tpot.p50, summary.tpot.p90, 1.0, 4.0)  # TTFT p50: the
    # fast group's slowest
    row = Row("disagg", "1P:1D", "4 req/s", point,
              Point("1P:1D", 4.0, 100, summary.ttft.p50, summary.ttft.p90, summary.tpot.p50, summary.tpot.p90, 1.0,
                    4.0))
    rank_cells(row, measured)
    assert row.error("ttft_p50") == pytest.approx(-0.7406, abs=1e-4)
    assert row.ranks["ttft_p50"] == pytest.approx(100 * 49 / 99)
    assert (row.ranks["tpot_p50"], row.ranks["tpot_p90"]) == (pytest.approx(50), pytest.approx(90))
    assert row.spans["ttft_p50"][0] < 0.015 and row.spans["ttft_p50"][1] > 0.1
    (line,) = ranks([row])
    assert line.startswith("disagg at 4 req/s, TTFT p50 -74.1%: the prediction is the measured p49 (p40-p60: ")
    assert "TTFT p50" in line and "p49" in table([row]) and "beyond" not in line
    assert f"\nRank: {line}\n" in markdown([row], make_profile(), "a test")


@pytest.mark.parametrize("serve_args, per, mps", [("--mps", 0.5, True), ("--mps --no-mps", 0.5, False),
                                                  ("--timeline-dir=x --mps", 0.5, True), ("", 0.5, False),
                                                  ("--mps", 1.0, False)])
def test_a_run_served_under_mps_is_replayed_under_mps_where_its_workers_shared_gpus(serve_args, per, mps):
    from scripts.planner.bench_replay import layout_of

    cfg = BenchConfig(model="m", out="o", prefill_workers=1, decode_workers=1, gpus_per_worker=per,
                      serve_args=serve_args)
    layout = layout_of({"mode": "disagg"}, cfg, make_profile())
    assert layout.mps == mps and layout.gpus_per_engine == per
