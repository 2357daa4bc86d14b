"""Stop 50: where a served 1P:1D run under MPS is slow, read off the bench's results (each request's token gaps, as
the client saw them) and the workers' timelines (`serve --timeline-dir`: when each prompt step ran, when each
request sat in the decode batch). Each gap of a short request's tokens is put in a class by what overlapped it:
the longest prompt in a prompt step in flight (none, short < 1k, mid < 4k, long), and whether a long request (4k
tokens or more) was in the decode batch; each class's mean gap is printed over the mean gap with neither. It also
prints each prompt step's time over the profile's cost of it (the prefill worker's pace beside the decode worker).

    python docs/gpu_runs/stop50_mps_gaps.py RESULTS.json TIMELINE_DIR PROFILE.json
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

from scripts.planner.profile import load_profile

LONG = 4096


def events(folder: str, worker: str) -> dict[int, dict[str, dict]]:
    by_request: dict[int, dict[str, dict]] = defaultdict(dict)
    with open(f"{folder}/{worker}.jsonl") as f:
        for line in f:
            e = json.loads(line)
            if "request" in e:  # not a `step` (stop 50's later timelines mark those too)
                by_request[int(e["request"].rsplit("-", 1)[1])][e["event"]] = e
    return by_request


def size(tokens: int) -> str:
    return "none" if tokens == 0 else "short" if tokens < 1024 else "mid" if tokens < LONG else "long"


def main(results: str, timelines: str, profile_path: str) -> None:
    run = json.load(open(results))["runs"][0]
    prefill, decode = events(timelines, "p0"), events(timelines, "d0")
    profile = load_profile(profile_path)
    points = run["points"]
    first = len(decode) - 150 * len(points)  # the bench's request ids: warm-up and unloaded ones, then 150 a point
    for n, point in enumerate(points):
        reqs = point["requests"]
        ids = [first + 150 * n + int(q["index"]) for q in reqs]
        offset = statistics.median(decode[i]["received"]["t"] - float(q["start"]) for i, q in zip(ids, reqs))
        steps: dict[float, list] = defaultdict(lambda: [[], 0.0])
        for i in ids:
            step = steps[prefill[i]["launched"]["t"]]
            step[0].append(prefill[i]["received"]["tokens"])
            step[1] = max(step[1], prefill[i]["prefilled"]["t"])
        prompt_steps = [(start, end, lens) for start, (lens, end) in steps.items()]
        resident = [(decode[i]["landed"]["t"], decode[i]["finished"]["t"]) for i in ids
                    if decode[i]["received"]["tokens"] >= LONG]
        gaps: dict[tuple[str, bool], list[float]] = defaultdict(list)
        for i, q in zip(ids, reqs):
            if decode[i]["received"]["tokens"] >= LONG:
                continue
            t = float(q["start"]) + offset + float(q["ttft"])
            for gap in q["itl"] if isinstance(q["itl"], list) else json.loads(q["itl"]):
                beside = max((max(lens) for a, b, lens in prompt_steps if a < t + gap and t < b), default=0)
                long_in_batch = any(a <= t + gap / 2 < b for a, b in resident)
                gaps[(size(beside), long_in_batch)].append(gap)
                t += gap
        alone = statistics.mean(gaps[("none", False)])
        row = "  ".join(f"{s}{'+long in batch' if r else ''} x{statistics.mean(v) / alone:.2f} (n={len(v)})"
                        for (s, r), v in sorted(gaps.items()) if (s, r) != ("none", False))
        print(f"{point['load']['label']}: decode gap alone {alone * 1e3:.2f} ms; {row}")
        paces: dict[str, list[float]] = defaultdict(list)
        for start, end, lens in prompt_steps:
            cost = profile.prefill.step_seconds(sum(lens), [(k, 0) for k in lens])
            paces[size(max(lens))].append((end - start) / cost)
        print("    prompt step over its cost: " + "  ".join(
            f"{s} x{statistics.median(v):.2f} (n={len(v)})" for s, v in sorted(paces.items())))


if __name__ == "__main__":
    main(*sys.argv[1:4])
