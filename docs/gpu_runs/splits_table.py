"""Issues 22, 19: the P:D splits and colocated replicas of a machine, side by side per rate, from the `pdcluster
bench` runs of docs/gpu_runs/splits.sh (one results.json a split, under ROOT/<split>/): goodput, TTFT and TPOT
p50 / p90, and the KV transport each split's handoffs took.

    python docs/gpu_runs/splits_table.py ROOT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from scripts.bench_report import handoff_rows


def layout(run: dict) -> str:
    workers = run["hardware"]["workers"]
    if "colocated" in workers:
        return f"colocated x{workers['colocated']}"
    policy = run["mode"].partition(":")[2]
    return f"{workers['prefill']}P:{workers['decode']}D" + (f" ({policy})" if policy else "")


def main() -> None:
    root = Path(sys.argv[1])
    rows: dict[str, list[str]] = {}
    for path in sorted(root.glob("*/results.json")):
        results = json.loads(path.read_text())
        for run in results["runs"]:
            if run.get("error"):
                print(f"{path.parent.name} {run['mode']}: {run['error']}")
                continue
            for point in run["points"]:
                s = point["summary"]
                ms = lambda d, q: "n/a" if d[q] is None else f"{1e3 * d[q]:.1f}"
                (_, (transport,)), = handoff_rows([point]) or [("", ("n/a",))]
                rows.setdefault(point["load"]["label"], []).append(
                    f"| {layout(run)} | {s['goodput']:.2f} | {ms(s['ttft'], 'p50')} / {ms(s['ttft'], 'p90')} | "
                    f"{ms(s['tpot'], 'p50')} / {ms(s['tpot'], 'p90')} | {s['completed']}/{s['requests']} | {transport} |")
    for label, lines in rows.items():
        print(f"\n{label}\n\n| layout | goodput (req/s) | TTFT p50 / p90 (ms) | TPOT p50 / p90 (ms) | ok | KV handoffs |")
        print("| --- | ---: | --- | --- | --- | --- |")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
