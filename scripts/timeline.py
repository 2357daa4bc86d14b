"""Where a request's time went inside the workers, from `pdcluster serve --timeline-dir DIR`'s files
(common/worker/timeline.py): the requests are split into load points wherever no request starts for `--gap`
seconds (a bench drains between its rates), and for each, the p50 and p90 of each part of the path (ms).

Disaggregated (a reservation on a decode worker, then the prompt on a prefill worker):
  to prefill     decode worker got the reservation -> prefill worker got the prompt (the answer, the router, the task)
  queue          prefill worker got it -> the step with its prompt (its first chunk) was launched
  prefill        that launch -> its first token collected (the step, and the next step's launch before collecting)
  send           collected -> KV handed to the transport, its record about to go out
  record         -> the record reached the decode worker
  land           record -> KV landed and the first token reported
  seat           first token reported -> its first decode step launched on the decode worker
Colocated (or prefilled by the decode worker itself): only the queue (received -> launched).

Where the workers marked their steps (`step` events), each load point's decode steps too: their GPU time with no
prompt step in flight, and over that, beside prompt steps (by their longest prompt) and in the milliseconds after a
prompt step of 4k tokens or more ended.

With `--profile P` (`pdcluster profile`'s JSON for the GPU that served), each load point's prefill steps are set
against that profile's time for them alone on a GPU: a step from when it had the GPU's queue to itself (its
launch, or the previous step's end if it was launched while that ran) to its first token, over its time alone
(the profile's `prompt_step`). Where the prefill worker shares its GPU with a decode worker that always has a step
queued (the one-GPU disaggregated runs), `pace` is what the two engines got of the GPU together, as processor
sharing reads it (steps on a GPU of their own: 1 / slowdown instead): 2 x GPU-bound time alone / GPU-bound time
there; 1 is what scripts/planner/gpu.py's processor sharing assumes.

Where the workers marked pauses of their own processes (a full garbage collection, the timeline's own write) or a KV
send's own time, each load point's count and longest.

With `--mps-points` (a run served under MPS), the points of a profile's `mps` costs: each role's c by the longest
prompt of a pair (`beside_by_prompt`) and, with `--profile`, prefill's factor on it by the decode rows beside a
prompt step (`beside_by_rows`).

    python -m scripts.timeline DIR [--max-tokens N] [--gap S] [--profile P] [--mps-points]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from scripts.bench_metrics import percentile
from scripts.planner.profile import Profile, load_profile

DISAGG_PARTS = [("to prefill", ("decode", "received"), ("prefill", "received")),
                ("queue", ("prefill", "received"), ("prefill", "launched")),
                ("prefill", ("prefill", "launched"), ("prefill", "prefilled")),
                ("send", ("prefill", "prefilled"), ("prefill", "kv_sent")),
                ("record", ("prefill", "kv_sent"), ("decode", "kv_record")),
                ("land", ("decode", "kv_record"), ("decode", "landed")),
                ("seat", ("decode", "landed"), ("decode", "launched"))]


def events(folder: Path) -> Iterator[dict]:
    """Every event of every worker's file in `folder`."""
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            yield json.loads(line)


def load(folder: Path) -> dict[str, dict[tuple[str, str], dict]]:
    """request -> (role, event) -> the event (its first, for a request that passed a worker more than once)."""
    requests: dict[str, dict[tuple[str, str], dict]] = defaultdict(dict)
    for e in events(folder):
        if "request" in e:  # not a worker's `step`
            requests[e["request"]].setdefault((e["role"], e["event"]), e)
    return requests


def load_steps(folder: Path) -> list[dict]:
    """Every worker's `step` events, in time order, each with `start` added: when its batch's GPU work began
    (collected less its GPU time; off CUDA, less its step time)."""
    steps = [e for e in events(folder) if "request" not in e and e["event"] == "step"]
    for e in steps:
        e["start"] = e["t"] - (e["gpu_us"] or e["step_us"]) / 1e6
    return sorted(steps, key=lambda e: e["t"])


PAUSES = {"gc_pause": "gc", "flush_pause": "timeline flush"}  # a worker's own pauses (common/worker/timeline.py)
LONG_SEND_US = 20_000  # a KV send this long is broken down (its wait, its copy, its CPU), the longest three a point


def load_pauses(folder: Path) -> list[dict]:
    """Every worker's marked pauses of its own process, in time order."""
    return sorted((e for e in events(folder) if e["event"] in PAUSES), key=lambda e: e["t"])


def pause_report(point: list[dict], pauses: list[dict]) -> str | None:
    """The point's pauses of the workers' own processes, by kind (count and longest), and its KV sends' own time
    (`kv_sent`'s `send_us`, p99 and longest), where any were marked."""
    first, last = span(point)
    cells = []
    for kind, name in PAUSES.items():
        us = [e["us"] for e in pauses if e["event"] == kind and first <= e["t"] <= last]
        if us:
            cells.append(f"{name} {len(us)} (longest {max(us) / 1e3:.1f} ms)")
    marks = [r[("prefill", "kv_sent")] for r in point if "send_us" in r.get(("prefill", "kv_sent"), {})]
    if marks:
        sends = [m["send_us"] for m in marks]
        cells.append(f"kv send p99 {percentile(sends, 99) / 1e3:.2f} ms (longest {max(sends) / 1e3:.1f})")
        cells += [long_send(m) for m in sorted(marks, key=lambda m: -m["send_us"])[:3] if m["send_us"] >= LONG_SEND_US]
    return "pauses: " + ", ".join(cells) if cells else None


def long_send(mark: dict) -> str:
    """Where a long KV send's time went, as far as its worker marked it: the wait for its copy, the copy's GPU time,
    the sending thread's CPU time (a thread off the CPU, or waiting for the GIL, has little)."""
    parts = [f"{name} {mark[key] / 1e3:.1f}" for key, name in
             (("wait_us", "waited"), ("copy_us", "copy on the GPU"), ("cpu_us", "CPU")) if key in mark]
    return f"a send of {mark['send_us'] / 1e3:.1f} ms" + (f" ({', '.join(parts)})" if parts else "")


def span(point: list[dict]) -> tuple[float, float]:
    """A load point's first and last event."""
    times = [e["t"] for r in point for e in r.values()]
    return min(times), max(times)


def class_of(x: float, tops: tuple[int | None, ...]) -> int:
    """The index of the first class whose upper end (None: none) is above `x`."""
    return next(i for i, top in enumerate(tops) if top is None or x < top)


def load_points(requests: dict[str, dict], gap: float) -> list[list[dict]]:
    """The requests in order of their first event, split where none starts for `gap` seconds."""
    ordered = sorted(requests.values(), key=lambda r: min(e["t"] for e in r.values()))
    points: list[list[dict]] = []
    last = None
    for r in ordered:
        start = min(e["t"] for e in r.values())
        if last is None or start - last > gap:
            points.append([])
        points[-1].append(r)
        last = start
    return points


def parts(r: dict) -> dict[str, float] | None:
    """A disaggregated request's parts (seconds), or None for one that did not pass every point."""
    if not all(a in r and b in r for _, a, b in DISAGG_PARTS):
        return None
    return {name: r[b]["t"] - r[a]["t"] for name, a, b in DISAGG_PARTS}


def prefill_steps(point: list[dict]) -> list[tuple[float, float, list[int]]]:
    """The prefill workers' steps among these requests, each (start, first token collected, its prompts' tokens): a
    step is the requests one worker launched at one instant, and it starts at its launch, or at the previous step's
    end where it was launched while that one ran (the engine launches a step before collecting the one before)."""
    steps: dict[tuple[str, float], list] = {}
    for r in point:
        launched, done, got = (r.get(("prefill", "launched")), r.get(("prefill", "prefilled")),
                               r.get(("prefill", "received")))
        if launched and done and got:
            step = steps.setdefault((launched["worker"], launched["t"]), [launched["t"], 0.0, []])
            step[1] = max(step[1], done["t"])
            step[2].append(got.get("tokens", 0))
    timed, last_end = [], {}
    for (worker, _), (start, end, prompts) in sorted(steps.items(), key=lambda kv: kv[1][0]):
        timed.append((max(start, last_end.get(worker, start)), end, prompts))
        last_end[worker] = end
    return timed


def step_report(point: list[dict], profile: Profile, max_tokens: int | None) -> str:
    """`prefill steps N: slowdown p50 / p90 (steps of one prompt, of several), pace p50` for the point's prefill steps
    of at most `max_tokens`, each set against the profile's time for its prompts (each a chunk of its own) alone."""
    slowdown, pace, by_count = [], [], {"one prompt": [], "several": []}
    for start, end, prompts in prefill_steps(point):
        tokens = sum(prompts)
        if max_tokens is not None and tokens > max_tokens:
            continue
        alone, floor = profile.prompt_step(tokens, [(n, 0) for n in prompts])
        if end - start > floor and alone > floor:
            slowdown.append((end - start) / alone)
            pace.append(2 * (alone - floor) / (end - start - floor))
            by_count["one prompt" if len(prompts) == 1 else "several"].append(slowdown[-1])
    if not slowdown:
        return "no prefill steps"
    split = ", ".join(f"{name} {statistics.median(x):.2f} of {len(x)}" for name, x in by_count.items() if x)
    return (f"prefill steps {len(slowdown)}: x alone {statistics.median(slowdown):.2f} / "
            f"{percentile(slowdown, 90):.2f} "
            f"({split}), pace {statistics.median(pace):.2f}")


PROMPT_CLASSES = ((1024, "< 1k"), (4096, "1k-4k"), (None, "4k+"))  # a prompt step by its longest prompt
AFTER_LONG_MS = (5, 10, 20)  # bins of the time since the last 4k+ prompt step ended


def prompt_class(longest: int) -> str:
    return next(name for limit, name in PROMPT_CLASSES if limit is None or longest < limit)


def decode_step_report(point: list[dict], steps: list[dict]) -> str | None:
    """The point's decode steps (decode and colocated workers' `step` events from its first request's start to its
    last event): their GPU time with no prompt step in flight on a prefill worker, and the others' over that, by the
    longest prompt of the prompt step beside them, and after a 4k+ prompt step ended (by AFTER_LONG_MS). Each class
    also has its steps' intervals (from the step before's end) over their GPU time: above 1, the GPU waited for the
    worker's host (its launch, or late launch's wait)."""
    first, last = span(point)
    prompts = prefill_steps(point)
    long_ends = sorted(end for _, end, p in prompts if prompt_class(max(p)) == "4k+")
    by: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in steps:
        if e["role"] == "prefill" or not first <= e["start"] <= last:
            continue
        beside = [max(p) for start, end, p in prompts if start < e["t"] and e["start"] < end]
        if beside:
            key = f"beside {prompt_class(max(beside))}"
        else:
            since = [1e3 * (e["start"] - end) for end in long_ends if end <= e["start"]]
            after = next((ms for ms in AFTER_LONG_MS if since and min(since) < ms), None)
            key = f"{after} ms after 4k+" if after else "alone"
        gpu = e["t"] - e["start"]
        by[key].append((gpu, e["step_us"] / 1e6 / gpu if gpu > 0 else 1.0))
    if not by.get("alone"):
        return None

    def medians(key: str) -> tuple[float, float]:
        return statistics.median(g for g, _ in by[key]), statistics.median(i for _, i in by[key])

    alone, interval = medians("alone")
    order = [f"beside {name}" for _, name in PROMPT_CLASSES] + [f"{ms} ms after 4k+" for ms in AFTER_LONG_MS]
    cells = ", ".join(f"{key} x{gpu / alone:.2f} ({len(by[key])}; interval x{waits:.2f})"
                      for key in order if key in by for gpu, waits in [medians(key)])
    return (f"decode steps: {1e3 * alone:.3f} ms alone (p50; interval x{interval:.2f}); "
            + (cells or "none beside a prompt step"))


MPS_CLASSES = (512, 1024, 2048, 4096, 8192, None)  # upper ends of the classes of a pair's longest prompt
MPS_MIN_STEPS = 5  # a class's fewest steps to give a point


def mps_points(points: list[list[dict]], steps: list[dict], profile: Profile | None) -> dict[str, list[list]]:
    """`MpsCost.beside_by_prompt`'s points by role, from runs served under MPS: for each class of the longest prompt
    of a prompt step, (its median tokens, the median c). Decode: a step wholly inside one prompt step, over the same
    load point's steps with none in flight, less 1. Prefill (with `profile`): a prompt step's GPU-bound time over the
    profile's alone, less 1, as if a decode step was in flight throughout (it is, but for the launch between two)."""
    by: dict[str, dict[int, list[tuple[int, float]]]] = {"decode": defaultdict(list), "prefill": defaultdict(list)}

    def add(role: str, longest: int, c: float) -> None:
        by[role][class_of(longest, MPS_CLASSES)].append((longest, c))

    for point in points:
        first, last = span(point)
        prompts = prefill_steps(point)
        decodes = [e for e in steps if e["role"] != "prefill" and first <= e["start"] <= last]
        inside = {id(e): [p for start, end, p in prompts if start < e["t"] and e["start"] < end] for e in decodes}
        alone = [e["t"] - e["start"] for e in decodes if not inside[id(e)]]
        base = statistics.median(alone) if alone else None
        for e in decodes if base else []:
            within = [p for start, end, p in prompts if start <= e["start"] and e["t"] <= end]
            if len(inside[id(e)]) == 1 and within:
                add("decode", max(within[0]), (e["t"] - e["start"]) / base - 1)
        for start, end, p in prompts if profile is not None else []:
            time_alone, floor = profile.prompt_step(sum(p), [(n, 0) for n in p])
            if end - start > floor and time_alone > floor:
                add("prefill", max(p), (end - start - floor) / (time_alone - floor) - 1)
    return {role: [[round(statistics.median(t for t, _ in cell)), round(statistics.median(c for _, c in cell), 3)]
                   for _, cell in sorted(classes.items()) if len(cell) >= MPS_MIN_STEPS]
            for role, classes in by.items()}


ROWS_BASE = 8  # a prompt step beside fewer decode rows than this sets its prompt class's c (rows' factor 1)
ROWS_CLASSES = (8, 16, 24, 32, 40, 48, 56, None)  # upper ends of the classes of a decode step's rows


def decode_rows(start: float, end: float, decodes: list[dict]) -> float:
    """The decode rows beside a prompt step from `start` to `end`: the decode steps' rows over their overlap with it,
    weighted by its length (0: none overlaps)."""
    spans = [(min(e["t"], end) - max(e["start"], start), e.get("seqs", 0)) for e in decodes
             if e["start"] < end and start < e["t"]]
    busy = sum(span for span, _ in spans)
    return sum(span * rows for span, rows in spans) / busy if busy > 0 else 0.0


def mps_rows_points(points: list[list[dict]], steps: list[dict], profile: Profile) -> list[list]:
    """Prefill's `MpsCost.beside_by_rows` points from a run served under MPS: each prompt step's c (as `mps_points`
    reads it) over the median c of its prompt class's steps beside fewer than ROWS_BASE decode rows, by the decode
    rows beside it; for each class of rows, (its median rows, the median factor)."""
    by_prompt: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for point in points:
        first, last = span(point)
        decodes = [e for e in steps if e["role"] != "prefill" and first <= e["start"] <= last and e.get("seqs", 0)]
        for start, end, p in prefill_steps(point):
            time_alone, floor = profile.prompt_step(sum(p), [(n, 0) for n in p])
            rows = decode_rows(start, end, decodes)
            if end - start > floor and time_alone > floor and rows > 0:
                c = (end - start - floor) / (time_alone - floor) - 1
                by_prompt[class_of(max(p), MPS_CLASSES)].append((rows, c))
    by_rows: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for cell in by_prompt.values():
        base = [c for rows, c in cell if rows < ROWS_BASE]
        if len(base) < MPS_MIN_STEPS or statistics.median(base) <= 0:
            continue
        for rows, c in cell:
            by_rows[class_of(rows, ROWS_CLASSES)].append((rows, c / statistics.median(base)))
    return [[round(statistics.median(r for r, _ in cell)), round(statistics.median(f for _, f in cell), 3)]
            for _, cell in sorted(by_rows.items()) if len(cell) >= MPS_MIN_STEPS]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path)
    p.add_argument("--max-tokens", type=int, default=None, help="only prompts of at most this many tokens")
    p.add_argument("--gap", type=float, default=2.0, help="seconds without a new request that end a load point")
    p.add_argument("--profile", type=Path, default=None,
                   help="the serving GPU's profile: set each point's prefill steps against their time alone")
    p.add_argument("--mps-points", action="store_true",
                   help="a run served under MPS: print each role's `beside_by_prompt` points for a profile's `mps` "
                        "(prefill's need --profile), and with --profile prefill's `beside_by_rows`")
    args = p.parse_args(argv)
    profile = load_profile(args.profile) if args.profile else None
    requests, steps, pauses = load(args.folder), load_steps(args.folder), load_pauses(args.folder)
    if not requests:
        raise SystemExit(f"{args.folder}: no timeline events (was the cluster served with --timeline-dir?)")
    names = [name for name, _, _ in DISAGG_PARTS]
    print("load point | requests (rate) | " + " | ".join(names) + " | sum (ms, p50 / p90)")
    for point in load_points(requests, args.gap):
        starts = [min(e["t"] for e in r.values()) for r in point]
        rate = (len(point) - 1) / (max(starts) - min(starts)) if len(point) > 1 and max(starts) > min(starts) else 0.0
        split = [x for r in point if (x := parts(r)) is not None and (
            args.max_tokens is None or r[("decode", "received")].get("tokens", 0) <= args.max_tokens)]
        if not split:
            queue = [r[(k, "launched")]["t"] - r[(k, "received")]["t"] for r in point for k in ("colocated", "decode")
                     if (k, "launched") in r and (k, "received") in r]
            if queue:
                print(f"{min(starts):.1f} | {len(point)} ({rate:.1f}/s) | queue "
                      f"{1e3 * statistics.median(queue):.2f} / {1e3 * percentile(queue, 90):.2f}")
            continue
        cells = [f"{1e3 * statistics.median(x[n] for x in split):.2f} / "
                 f"{1e3 * percentile([x[n] for x in split], 90):.2f}"
                 for n in names]
        total = [sum(x.values()) for x in split]
        print(f"{min(starts):.1f} | {len(split)} of {len(point)} ({rate:.1f}/s) | " + " | ".join(cells)
              + f" | {1e3 * statistics.median(total):.2f} / {1e3 * percentile(total, 90):.2f}")
        if profile is not None:
            print(f"    {step_report(point, profile, args.max_tokens)}")
        if steps and (line := decode_step_report(point, steps)) is not None:
            print(f"    {line}")
        if (line := pause_report(point, pauses)) is not None:
            print(f"    {line}")
    if args.mps_points:
        points = load_points(requests, args.gap)
        for role, found in mps_points(points, steps, profile).items():
            print(f"mps {role} beside_by_prompt: {json.dumps(found)}")
        if profile is not None:
            print(f"mps prefill beside_by_rows: {json.dumps(mps_rows_points(points, steps, profile))}")


if __name__ == "__main__":
    main()
