"""scripts/timeline.py's prefill steps against a profile (`--profile`): steps grouped by launch, each timed from
when it had the worker's GPU queue to itself, set against the profile's time alone."""
from __future__ import annotations

import json

import pytest

from scripts import timeline
from tests.test_planner import make_profile


def event(t: float, role: str, request: str, name: str, **extra) -> dict:
    return {"t": t, "worker": f"{role[0]}0", "role": role, "request": request, "event": name, **extra}


def write_prefill_steps(folder, steps: list[tuple[float, float, list[int]]]) -> None:
    """A prefill worker's timeline: each step (launched, first token collected, prompt tokens of its requests)."""
    lines, n = [], 0
    for launched, done, prompts in steps:
        for tokens in prompts:
            rid = f"r{n}"
            n += 1
            lines += [event(launched - 0.001, "prefill", rid, "received", tokens=tokens),
                      event(launched, "prefill", rid, "launched"), event(done, "prefill", rid, "prefilled")]
    (folder / "p0.jsonl").write_text("\n".join(json.dumps(e) for e in lines))


def test_a_step_launched_while_the_one_before_ran_is_timed_from_that_ones_end(tmp_path):
    # The second step is launched at 5 ms, while the first (to 10 ms) runs; its two prompts count together.
    write_prefill_steps(tmp_path, [(0.0, 0.010, [300]), (0.005, 0.018, [200, 100]), (0.030, 0.034, [64])])
    point = list(timeline.load(tmp_path).values())
    steps = timeline.prefill_steps(point)
    assert [prompts for _, _, prompts in steps] == [[300], [200, 100], [64]]
    assert [t for start, end, _ in steps for t in (start, end)] == pytest.approx([0.0, 0.010, 0.010, 0.018,
                                                                                  0.030, 0.034])


def test_the_report_sets_each_step_against_its_time_alone(tmp_path):
    """Eager steps (a profile without prompt graphs): alone = launch + base + per token; the floor (launch + base)
    goes at the host's pace, so the GPU pace of two engines is 2 x (alone - floor) / (measured - floor)."""
    profile = make_profile()
    alone, floor = profile.prompt_step(100)
    assert floor == pytest.approx(profile.host_launch_s + profile.prefill.base_s)
    # One step exactly as processor sharing between two engines at full pace has it (GPU part twice as long),
    # one twice that slow.
    shared = floor + 2 * (alone - floor)
    write_prefill_steps(tmp_path, [(0.0, shared, [100]), (1.0, 1.0 + floor + 4 * (alone - floor), [100]),
                                   (2.0, 2.0 + alone, [5000])])
    point = list(timeline.load(tmp_path).values())
    report = timeline.step_report(point, profile, max_tokens=2048)  # the 5000-token step is left out
    assert report.startswith("prefill steps 2:")
    slowdowns = sorted([shared / alone, (floor + 4 * (alone - floor)) / alone])
    assert f"x alone {(slowdowns[0] + slowdowns[1]) / 2:.2f}" in report
    assert "pace 0.75" in report  # the median of 1.0 and 0.5
    assert timeline.step_report(point, profile, max_tokens=10) == "no prefill steps"


def test_a_step_of_several_prompts_is_set_against_their_chunks_and_reported_apart(tmp_path):
    """Attention grows with each prompt's own square: two prompts of 100 in one step are set against two chunks of
    100, not one of 200, and steps of one prompt and of several are reported apart."""
    from scripts.planner.profile import PrefillCost

    profile = make_profile(prefill=PrefillCost(base_s=0.01, per_token_s=1e-4, per_chunk_pair_s=1e-6))
    two, _ = profile.prompt_step(200, [(100, 0), (100, 0)])
    one, _ = profile.prompt_step(200)
    assert one - two == pytest.approx(1e-6 * (200 * 200 - 2 * 100 * 100) / 2)
    write_prefill_steps(tmp_path, [(0.0, 1.1 * one, [200]), (1.0, 1.0 + 0.9 * two, [100, 100])])
    report = timeline.step_report(list(timeline.load(tmp_path).values()), profile, max_tokens=None)
    assert "(one prompt 1.10 of 1, several 0.90 of 1)" in report


def test_the_command_prints_the_step_report_under_each_point(tmp_path, capsys):
    profile_path = tmp_path / "profile.json"
    from scripts.planner.profile import save_profile
    save_profile(make_profile(), profile_path)
    folder = tmp_path / "timeline"
    folder.mkdir()
    write_prefill_steps(folder, [(0.0, 0.030, [100])])
    decode = [event(-0.002, "decode", "r0", "received", tokens=100), event(0.031, "decode", "r0", "kv_record"),
              event(0.032, "decode", "r0", "landed"), event(0.033, "decode", "r0", "launched")]
    prefill_sent = [event(0.0305, "prefill", "r0", "kv_sent")]
    (folder / "d0.jsonl").write_text("\n".join(json.dumps(e) for e in decode))
    (folder / "p1.jsonl").write_text("\n".join(json.dumps(e) for e in prefill_sent))
    timeline.main([str(folder), "--profile", str(profile_path)])
    out = capsys.readouterr().out.splitlines()
    assert " | 1 of 1 " in out[1]
    assert out[2].strip().startswith("prefill steps 1: x alone")


def test_a_workers_steps_are_marked_without_a_request_and_left_out_of_the_requests(tmp_path):
    from common.worker.timeline import Timeline

    tl = Timeline(str(tmp_path), "d0", "decode")
    tl.mark("r0", "received", t=1.0, tokens=12)
    tl.step(0.0012, 0.00105, 3)
    tl.flush()
    lines = [json.loads(line) for line in (tmp_path / "d0.jsonl").read_text().splitlines()]
    step = lines[1]
    assert "request" not in step and (step["event"], step["step_us"], step["gpu_us"], step["seqs"]) == \
        ("step", 1200, 1050, 3)
    assert step["worker"] == "d0" and step["role"] == "decode" and step["t"] > 0
    assert list(timeline.load(tmp_path)) == ["r0"]
    off = Timeline(None, "d0", "decode")
    off.step(0.001, 0.001, 1)
    assert not off.on and off._events == []


def test_decode_steps_are_set_against_the_prompt_steps_beside_them_and_the_end_of_a_long_one(tmp_path):
    """A decode worker's `step` events, each from its GPU work's start to its collection, classed by the prefill
    worker's prompt steps: alone (the base), beside one (by its longest prompt), or so long after a 4k+ one ended."""
    write_prefill_steps(tmp_path, [(0.100, 0.110, [6000]), (0.200, 0.203, [300, 200]), (0.300, 0.305, [2000])])

    def step(end: float, gpu_ms: float, role: str = "decode", interval_ms: float | None = None) -> dict:
        return {"t": end, "worker": f"{role[0]}0", "role": role, "event": "step",
                "step_us": round((interval_ms or gpu_ms) * 1e3), "gpu_us": round(gpu_ms * 1e3), "seqs": 4}

    steps = [step(0.140 + 0.01 * i, 1.0) for i in range(5)]  # alone: 1 ms, 29+ ms after the long prompt
    steps += [step(0.106, 3.0),  # beside the 6,000-token prompt
              step(0.1135, 1.5, interval_ms=3.0), step(0.1182, 1.2), step(0.1261, 1.1),  # 2, 7, 15 ms after it
              # ended; the first 3 ms after the step before it ended: the GPU waited 1.5 ms for the host
              step(0.2015, 2.0), step(0.303, 1.5),  # beside the short prompts' step, beside the 2,000-token one
              step(0.150, 9.0, role="prefill"), step(0.900, 9.0)]  # a prefill worker's, and one after the point
    (tmp_path / "d0.jsonl").write_text("\n".join(json.dumps(e) for e in steps))
    loaded = timeline.load_steps(tmp_path)
    assert [e["start"] for e in loaded[:2]] == pytest.approx([0.103, 0.112])
    (point,) = timeline.load_points(timeline.load(tmp_path), gap=2.0)
    line = timeline.decode_step_report(point, loaded)
    assert line == ("decode steps: 1.000 ms alone (p50; interval x1.00); beside < 1k x2.00 (1; interval x1.00), "
                    "beside 1k-4k x1.50 (1; interval x1.00), beside 4k+ x3.00 (1; interval x1.00), "
                    "5 ms after 4k+ x1.50 (1; interval x2.00), 10 ms after 4k+ x1.20 (1; interval x1.00), "
                    "20 ms after 4k+ x1.10 (1; interval x1.00)")
    beside_only = [e for e in loaded if e["gpu_us"] != 1000]
    assert timeline.decode_step_report(point, beside_only) is None  # none alone: nothing to set them against


def test_mps_points_are_each_roles_c_by_the_longest_prompt_of_the_prompt_step(tmp_path):
    """Under MPS a decode step wholly inside a prompt step takes (1 + c) times the point's decode steps with none in
    flight: c 0.25 beside 300-token prompts, 2.0 beside 6,000-token ones. A prompt step's GPU-bound time over the
    profile's alone is 1 + its c. A class of fewer than five steps gives no point."""
    from tests.test_planner import make_profile

    profile = make_profile()
    prefill_c, decode_c = {300: 0.7, 6000: 0.2, 1500: 0.0}, {300: 0.25, 6000: 2.0, 1500: 0.0}
    prompts, decodes, t = [], [], 0.0

    def decode(end: float, c: float = 0.0) -> None:
        decodes.append({"t": end, "worker": "d0", "role": "decode", "event": "step", "step_us": round(1e3 * (1 + c)),
                        "gpu_us": round(1e3 * (1 + c))})

    for tokens in [300, 6000] * 6 + [1500]:  # one step of 1,500 tokens: too few for a point
        alone, floor = profile.prompt_step(tokens, [(tokens, 0)])
        end = t + floor + (alone - floor) * (1 + prefill_c[tokens])
        prompts.append((t, end, [tokens]))
        decode(t + 0.0001 + 1e-3 * (1 + decode_c[tokens]), decode_c[tokens])  # wholly inside
        decode(end + 0.0002, 5.0)  # overlapping its end: not wholly inside
        decode(end + 0.0035)  # alone: 1 ms
        t = end + 0.004
    write_prefill_steps(tmp_path, prompts)
    (tmp_path / "d0.jsonl").write_text("\n".join(json.dumps(e) for e in decodes))
    points = timeline.load_points(timeline.load(tmp_path), gap=2.0)
    found = timeline.mps_points(points, timeline.load_steps(tmp_path), profile)
    assert found["decode"] == [[300, pytest.approx(0.25, abs=2e-3)], [6000, pytest.approx(2.0, abs=2e-3)]]
    assert found["prefill"] == [[300, pytest.approx(0.7, abs=2e-3)], [6000, pytest.approx(0.2, abs=2e-3)]]
    assert timeline.mps_points(points, timeline.load_steps(tmp_path), None)["prefill"] == []


def test_mps_rows_points_are_prefills_c_by_the_decode_rows_beside_it_over_its_prompt_class_at_few_rows(tmp_path):
    """Prompt steps of one class (1,500 tokens) beside decode steps of 4 rows take c 0.3 over the profile's alone,
    beside 40 rows c 0.6: the factor by rows is 1 at 4 and 2 at 40. A step's rows are its decode steps' rows
    weighted by their overlap with it. A class with fewer than five steps at few rows gives no factor."""
    from tests.test_planner import make_profile

    profile = make_profile()
    prompts, decodes, t = [], [], 0.0
    for tokens, rows, c in [(1500, 4, 0.3)] * 6 + [(1500, 40, 0.6)] * 6 + [(6000, 40, 0.1)] * 6:
        alone, floor = profile.prompt_step(tokens, [(tokens, 0)])
        end = t + floor + (alone - floor) * (1 + c)
        prompts.append((t, end, [tokens]))
        decodes.append({"t": end, "worker": "d0", "role": "decode", "event": "step", "seqs": rows,
                        "step_us": 1, "gpu_us": round(1e6 * (end - t))})  # beside it throughout
        t = end + 0.004
    write_prefill_steps(tmp_path, prompts)
    (tmp_path / "d0.jsonl").write_text("\n".join(json.dumps(e) for e in decodes))
    points = timeline.load_points(timeline.load(tmp_path), gap=2.0)
    assert timeline.mps_rows_points(points, timeline.load_steps(tmp_path), profile) == [
        [4, pytest.approx(1.0, abs=2e-3)], [40, pytest.approx(2.0, abs=2e-3)]]
    steps = timeline.load_steps(tmp_path)
    assert timeline.decode_rows(steps[0]["start"], steps[0]["t"], steps) == pytest.approx(4.0)
    few, many = steps[5], steps[6]  # 4 rows, then 40
    half = (few["start"] + few["t"]) / 2
    a, b = few["t"] - half, many["t"] - many["start"]  # their overlaps with a span from half of one to the other's end
    assert timeline.decode_rows(half, many["t"], steps) == pytest.approx((4 * a + 40 * b) / (a + b))
    assert timeline.decode_rows(steps[-1]["t"] + 1, steps[-1]["t"] + 2, steps) == 0.0


def test_a_workers_own_pauses_are_marked_from_the_threshold_and_reported_by_load_point(tmp_path, capsys):
    """A full collection while the timeline watches is a `gc_pause`; a write to its file from `pause_s` on is a
    `flush_pause`, written with the next flush; a KV send's own time rides on `kv_sent`. The report gives each load
    point's count and longest, and the sends' p99."""
    import gc

    from common.worker.timeline import Timeline

    tl = Timeline(str(tmp_path), "p0", "prefill", pause_s=0.0)
    tl.mark("r0", "received", t=0.0, tokens=10)
    tl.watch_gc()
    gc.collect(0)  # not a full collection: no mark
    gc.collect()
    tl.unwatch_gc()
    gc.collect()  # no longer watched
    tl.mark("r0", "launched", t=0.001)
    tl.mark("r0", "prefilled", t=0.002)
    tl.mark("r0", "kv_sent", t=0.003, send_us=250_000, wait_us=249_000, copy_us=300, cpu_us=900)
    tl.flush()  # its own pause is held for the next flush
    tl.mark("r0", "finished", t=0.004)
    tl.flush()
    lines = [json.loads(line) for line in (tmp_path / "p0.jsonl").read_text().splitlines()]
    assert [e["event"] for e in lines if "request" not in e] == ["gc_pause", "flush_pause"]
    assert all(e["us"] >= 0 and e["worker"] == "p0" for e in lines if "request" not in e)
    pauses = timeline.load_pauses(tmp_path)
    for e in pauses:
        e["t"] = 0.001  # within the load point (their clock is the process's; the requests' here are made up)
    point = list(timeline.load(tmp_path).values())
    report = timeline.pause_report(point, pauses)
    assert report.startswith("pauses: gc 1 (longest") and "timeline flush 1" in report
    assert "kv send p99 250.00 ms (longest 250.0)" in report
    assert "a send of 250.0 ms (waited 249.0, copy on the GPU 0.3, CPU 0.9)" in report  # a long one, broken down
    quiet = Timeline(str(tmp_path / "q"), "p1", "prefill")  # the default threshold: a fast flush is no pause
    quiet.mark("r1", "received", t=0.0)
    quiet.flush()
    quiet.mark("r1", "finished", t=0.1)
    quiet.flush()
    assert all("request" in json.loads(line) for line in (tmp_path / "q" / "p1.jsonl").read_text().splitlines())
    assert timeline.pause_report(list(timeline.load(tmp_path / "q").values()), []) is None
