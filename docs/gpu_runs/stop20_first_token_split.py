"""Stop 20, issue 21, on the CPU: where a disaggregated short prompt's first token waits, by the router's clock
(queue, the reservation's round trip, reserved -> first token, router -> client), beside the same split in the
planner's simulation of the same requests (`Simulation` with the profile).

    python docs/gpu_runs/stop20_first_token_split.py RESULTS.json [PROFILE]
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys

from scripts.bench_metrics import RequestRecord
from scripts.planner import validate as V
from scripts.planner.profile import load_profile
from scripts.planner.sim import Simulation

SHORT = 2048  # prompt tokens: the long-short mix's short ones, every prefill-heavy one


def ms(xs: list[float]) -> float:
    return 1e3 * statistics.median(xs)


def main() -> None:
    results = json.load(open(sys.argv[1]))
    profile = load_profile(sys.argv[2] if len(sys.argv) > 2 else "scripts/planner/profiles/h100-qwen3-0.6b.json")
    cfg = V.bench_config(results)
    run = next(r for r in results["runs"] if r["mode"] == "disagg")
    layout = V.layout_of(run, cfg, profile)
    print("load | measured: queue, reservation round trip, reserved -> first, router -> client | "
          "simulated: round trip, reserved -> first (ms, p50)")
    for i, point in enumerate(run["points"]):
        records = sorted((RequestRecord.from_json(r) for r in point["requests"]), key=lambda r: r.index)
        sim = Simulation(profile, layout, dataclasses.replace(V.workload_of(results, cfg, i, records),
                                                              arrivals=[r.start for r in records]))
        reserved: dict[str, float] = {}
        run_on = sim._run_on

        def noted(name, req, prefill_only, run_on=run_on):
            if prefill_only:
                reserved[req.rid] = sim.now
            return run_on(name, req, prefill_only)

        sim._run_on = noted
        simulated = sim.run()
        pairs = [(r, s) for r, s in zip(records, simulated) if r.prompt_len <= SHORT and r.router_reserved is not None]
        print(f"{point['load']['label']} | {ms([r.router_queued for r, _ in pairs]):.2f}, "
              f"{ms([r.router_reserved - r.router_queued for r, _ in pairs]):.2f}, "
              f"{ms([r.router_ttft - r.router_reserved for r, _ in pairs]):.1f}, "
              f"{ms([r.ttft - r.router_ttft for r, _ in pairs]):.2f} | "
              f"{ms([reserved[s.rid] - s.dispatched for _, s in pairs]):.2f}, "
              f"{ms([s.first - reserved[s.rid] for _, s in pairs]):.1f}")


if __name__ == "__main__":
    main()
