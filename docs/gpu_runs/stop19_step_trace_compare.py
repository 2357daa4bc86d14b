"""Stop 19, issue 21, on the CPU: each batch of `stop19_step_trace.py`'s trace costed as the simulator costs it
(`SimEngine.step_seconds` with the profile), beside its measured GPU seconds; totals by kind of step (decode-only,
prompt-only, mixed) and, for the mixed ones, the error against the prompt tokens.

    python docs/gpu_runs/stop19_step_trace_compare.py STEP_TRACE.json [PROFILE]
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from types import SimpleNamespace

from scripts.planner.engine import SimEngine
from scripts.planner.profile import load_profile


def batch_of(rec: dict) -> SimpleNamespace:
    d = rec["decodes"]
    decodes = [SimpleNamespace(num_computed_tokens=rec["decode_context"] if i == 0 else 0) for i in range(d)]
    prompts = [SimpleNamespace(num_computed_tokens=c) for _, c in rec["prompt"]]
    return SimpleNamespace(num_decodes=d, seqs=decodes + prompts, num_new_tokens=[1] * d + [n for n, _ in rec["prompt"]])


def main() -> None:
    trace = json.load(open(sys.argv[1]))
    profile = load_profile(sys.argv[2] if len(sys.argv) > 2 else "scripts/planner/profiles/h100-qwen3-0.6b.json")
    stub = SimpleNamespace(profile=profile)
    stub._padded = lambda tokens: SimEngine._padded(stub, tokens)
    for name, point in trace.items():
        kinds = defaultdict(lambda: [0, 0.0, 0.0])  # kind -> batches, predicted s, measured s
        by_tokens = defaultdict(lambda: [0, 0.0, 0.0])
        for rec in point["batches"]:
            if rec.get("gpu_s") is None:
                continue
            predicted = SimEngine.step_seconds(stub, batch_of(rec))
            tokens = sum(n for n, _ in rec["prompt"])
            kind = "decode" if not tokens else ("prompt" if not rec["decodes"] else "mixed")
            for table, key in ((kinds, kind), (by_tokens, f"{kind} {'<=512' if tokens <= 512 else '<=2048' if tokens <= 2048 else '>2048'}" if tokens else None)):
                if key is None:
                    continue
                row = table[key]
                row[0] += 1
                row[1] += predicted
                row[2] += rec["gpu_s"]
        total_p = sum(r[1] for r in kinds.values())
        total_m = sum(r[2] for r in kinds.values())
        print(f"== {name}: wall {point['wall']:.2f} s, engine busy {point['busy']:.3f} s, TTFT p50 "
              f"{1e3 * point['ttft_p50']:.1f} p90 {1e3 * point['ttft_p90']:.1f} ms; batches costed {total_p:.3f} s, "
              f"GPU {total_m:.3f} s ({100 * (total_p - total_m) / total_m:+.1f}%)")
        for table in (kinds, by_tokens):
            for key, (n, p, m) in sorted(table.items()):
                print(f"   {key:<16} {n:>5} batches  predicted {1e3 * p / n:7.2f} ms  GPU {1e3 * m / n:7.2f} ms  "
                      f"({100 * (p - m) / m:+.1f}%)")


if __name__ == "__main__":
    main()
