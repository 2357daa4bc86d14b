"""Stop 22, issue 21: the client's TTFT minus the router's own, per mode and point of a bench run, beside the router's
event-loop stalls over that point: what the router's loop added to a first token on its way in and out.

    python docs/gpu_runs/stop22_client_router.py RESULTS.json [LABEL]
"""
from __future__ import annotations

import json
import sys

from scripts.bench_metrics import RequestRecord, percentile


def main() -> None:
    results = json.load(open(sys.argv[1]))
    label = sys.argv[2] if len(sys.argv) > 2 else ""
    print(f"{label} mode | point | client - router TTFT p50 / p90 / p99 / max (ms) | router loop stalls (s) | "
          "client loop stalls (s)")
    for run in results["runs"]:
        for point in run["points"]:
            records = [RequestRecord.from_json(r) for r in point["requests"]]
            gaps = sorted(1e3 * (r.ttft - r.router_ttft) for r in records
                          if r.ttft is not None and r.router_ttft is not None)
            router, client = point.get("router") or {}, point.get("client") or {}
            cells = " / ".join(f"{percentile(gaps, q):.1f}" for q in (50, 90, 99)) + f" / {gaps[-1]:.1f}"
            print(f"{label} {run['mode']} | {point['load']['label']} | {cells} | "
                  f"{router.get('loop_stalls', 0)} ({router.get('loop_stall_seconds', 0):.2f}) | "
                  f"{client.get('loop_stalls', 0)} ({client.get('loop_stall_seconds', 0):.2f})")


if __name__ == "__main__":
    main()
