"""Stop 32 (CPU only, no GPU): splits of N GPUs simulated behind one router (whole) and behind the routers the top
rate needs (from their shards, as `pdcluster plan` predicts them), side by side.

    PYTHONPATH=. python docs/gpu_runs/stop32_routers_compare.py MIX GPUS RATES REQUESTS SPLITS
    e.g.  ls 32 256,512 4000 24,20    (MIX: ls = long-short, ph = prefill-heavy; SPLITS: prefill engines)
"""
import sys
import time

from scripts.planner.config import PlanConfig
from scripts.planner.layout import Layout
from scripts.planner.plan import routers_for, workloads
from scripts.planner.profile import load_profile
from scripts.planner.report import summarize
from scripts.planner.shards import Outcome, mix, shards_of, stretched
from scripts.planner.sim import ACROSS_GPUS, simulate

MIXES = {"ls": dict(workload="long-short", input_len="128:512", output_len="128:512", long_input_len="4096:8192",
                    long_output_len="4:16", long_fraction=0.2, slo_ttft=1.0),
         "ph": dict(input_len="512:2048", output_len="64:256", slo_ttft=0.5)}


def row(tag, p):
    print(f"  {tag:<26} {p.rate:>6g} TTFT p50 {1e3 * p.ttft_p50:8.1f} p90 {1e3 * p.ttft_p90:8.1f}  TPOT p50 "
          f"{1e3 * p.tpot_p50:5.1f} p90 {1e3 * p.tpot_p90:5.1f}  in SLO {100 * p.attainment:5.1f}%  "
          f"goodput {p.goodput:7.1f}")


def main(name: str, n: int, rates: str, requests: int, splits: list[int]) -> None:
    cfg = PlanConfig(profile="scripts/planner/profiles/h200-qwen3-8b.json", gpus=n, rates=rates, slo_tpot=0.03,
                     num_requests=requests, **MIXES[name])
    profile, slo, loads = load_profile(cfg.profile), cfg.slo(), workloads(cfg)
    tokens = sum(sum(w.output_lens) for _, w in loads) / sum(len(w.output_lens) for _, w in loads)
    k = routers_for(cfg, "disagg", n, max(r for r, _ in loads), tokens)
    print(f"{name} {n} GPUs, {requests} requests a rate, {k} routers")
    for x in splits:
        layout = Layout(prefill=x, decode=n - x, transport=ACROSS_GPUS)
        for rate, w in loads:
            t = time.perf_counter()
            whole = summarize(str(layout), rate, simulate(profile, layout, w), slo)
            row(f"{layout} 1 router ({time.perf_counter() - t:.1f} s)", whole)
            t = time.perf_counter()
            parts = [(s.engines * c, c, Outcome.of(str(s), rate, simulate(profile, s, stretched(w, n / s.engines)),
                                                   slo))
                     for s, c in shards_of(layout, k).items()]
            row(f"{layout} {k} routers ({time.perf_counter() - t:.1f} s)", mix(str(layout), rate, parts))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), [int(x) for x in sys.argv[5].split(",")])
