"""Stop 37 (issue 21): the four-GPU knee's requests split by what they met, measured (a bench run's timelines) and
simulated (`plan --validate`'s replay of the same run). A short prompt (up to 2,048 tokens) either found a long one
on the prefill worker it was placed on, or not; each request's time runs from its reservation to its first token
(measured: the decode worker's `received` to `landed`; simulated: dispatch to first token, no offset added).

Run: python docs/gpu_runs/stop37_knee_split.py DIR   (DIR holding 3P1D/results.json and 3P1D-timeline/, from
`TIMELINE=1 ... LAYOUTS=3P1D docs/gpu_runs/splits.sh`; the run's last load point is split)
"""
from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_metrics import percentile  # noqa: E402
from scripts.planner.profile import load_profile  # noqa: E402
from scripts.planner.validate import replay_run  # noqa: E402

LONG = 2048
PROFILE = "scripts/planner/profiles/h200-qwen3-8b.json"

# (prefill worker, prompt tokens, reserved at, first token at), seconds
Item = tuple[str, int, float, float]


def measured(run: Path) -> list[Item]:
    """The last load point's requests, from the workers' timelines (load points end where none starts for 2 s)."""
    events: dict[str, dict] = collections.defaultdict(dict)
    for path in (run / "3P1D-timeline").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            d = events[e["request"]]
            d[(e["role"], e["event"])] = e["t"]
            if e["role"] == "prefill" and e["event"] == "received":
                d["worker"], d["tokens"] = e["worker"], e["tokens"]
    done = sorted((d for d in events.values() if {("decode", "received"), ("decode", "landed")} <= d.keys()
                   and "worker" in d), key=lambda d: d[("decode", "received")])
    last = [done[0]]
    for d in done[1:]:
        last = [d] if d[("decode", "received")] - last[-1][("decode", "received")] > 2.0 else last + [d]
    return [(d["worker"], d["tokens"], d[("decode", "received")], d[("decode", "landed")]) for d in last]


def simulated(run: Path) -> list[Item]:
    results = json.loads((run / "3P1D" / "results.json").read_text())
    replayed = replay_run(results, results["runs"][0], load_profile(PROFILE), {})
    phase = replayed.simulation.phase(replayed.first_point + len(replayed.records) - 1)
    return [(r.prefill_seq.worker, len(r.attempt_ids), r.dispatched, r.first) for r in phase
            if r.prefill_seq is not None and r.first is not None]


def split(items: list[Item]) -> tuple[list[float], list[float], int]:
    """The short prompts' times (ms): those placed where no long prompt was in progress, and the others; and how many
    of the others were placed so while some prefill worker had no long prompt in progress (placement's misses)."""
    longs = [(w, start, end) for w, tokens, start, end in items if tokens > LONG]
    workers = {w for w, *_ in items}
    alone, behind, avoidable = [], [], 0
    for w, tokens, start, end in items:
        if tokens <= LONG:
            busy = {w2 for w2, s2, e2 in longs if s2 <= start < e2}
            (behind if w in busy else alone).append((end - start) * 1e3)
            avoidable += w in busy and len(busy) < len(workers)
    return alone, behind, avoidable


def main(run: Path) -> None:
    for name, items in (("measured", measured(run)), ("simulated", simulated(run))):
        alone, behind, avoidable = split(items)
        every = [(end - start) * 1e3 for _, _, start, end in items]
        longs = [(end - start) * 1e3 for _, tokens, start, end in items if tokens > LONG]
        p50 = percentile(every, 50)
        print(f"{name:9s} {len(items)} requests, p50 {p50:.1f} ms; short prompts with no long one on their worker: "
              f"{len(alone)}, p50 / p90 {statistics.median(alone):.1f} / {percentile(alone, 90):.1f} ms; behind "
              f"one: {len(behind)} ({avoidable} while another worker had none), p10 / p50 "
              f"{percentile(behind, 10):.1f} / {statistics.median(behind):.1f} ms; requests of the first kind under "
              f"the p50: {sum(t <= p50 for t in alone) / len(every):.0%}; long prompts p50 "
              f"{statistics.median(longs):.0f} ms")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
