"""Stop 33: what two routers side by side served, taken together (docs/gpu_runs/stop33_two_routers.sh), beside one
router in front of both engines: TTFT and TPOT p50/p90 over every request at each rate, as `pdcluster bench`
reports them for one cluster.

Run: python docs/gpu_runs/stop33_merge.py RUN_DIR   (RUN_DIR holds router0/, router1/ and one/, each a results.json)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_metrics import RequestRecord, percentile  # noqa: E402


def points(path: Path) -> list[tuple[float, list[dict]]]:
    """(the whole cluster's rate, its requests) per load point of one results.json."""
    results = json.loads((path / "results.json").read_text())
    return [(p["load"]["value"], p["requests"]) for p in results["runs"][0]["points"]]


def row(name: str, rate: float, requests: list[dict]) -> str:
    ok = [r for r in map(RequestRecord.from_json, requests) if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    ms = [1e3 * percentile(v, q) for v in (ttfts, tpots) for q in (50, 90)]
    return (f"{name:<12}{rate:>6g}{len(ok):>5}/{len(requests):<5}" + "".join(f"{m:>10.1f}" for m in ms))


def main(run: Path) -> None:
    print(f"{'routers':<12}{'rate':>6}{'served':>11}{'TTFT p50':>10}{'p90':>10}{'TPOT p50':>10}{'p90':>10}  (ms)")
    two = list(zip(points(run / "router0"), points(run / "router1")))
    for (rate0, reqs0), (rate1, reqs1) in two:
        print(row("two", rate0 + rate1, reqs0 + reqs1))
    if (run / "one" / "results.json").exists():
        for rate, reqs in points(run / "one"):
            print(row("one", rate, reqs))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
