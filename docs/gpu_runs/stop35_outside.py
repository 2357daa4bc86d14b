"""Where a short prompt's first token waits outside the workers (stop 35): per load point of one disaggregated bench
run served with --timeline-dir, p50 / p90 ms over its prompts under 2,048 tokens, of
  inside   the decode worker's reservation received -> its first token reported (the timeline's `received` -> `landed`)
  router   the router's TTFT (its clock, `router_ttft`) less `inside`: to the decode worker, and back
  outside  the client's TTFT less the router's: the token to the client, through the client library
The timeline's requests are matched to the bench's by their order and prompt lengths.

    python docs/gpu_runs/stop35_outside.py RESULTS.json TIMELINE_DIR
"""
import glob
import json
import sys
from collections import defaultdict

from scripts.bench_metrics import percentile

results, folder = json.load(open(sys.argv[1])), sys.argv[2]
events, tokens = defaultdict(dict), {}
for path in glob.glob(f"{folder}/*.jsonl"):
    for line in open(path):
        e = json.loads(line)
        if e["role"] == "decode":
            events[e["request"]][e["event"]] = e["t"]
            if e["event"] == "received":
                tokens[e["request"]] = e["tokens"]
prefix = next(iter(tokens)).rpartition("-")[0]
order = [tokens.get(f"{prefix}-{i}") for i in range(max(int(r.rpartition("-")[2]) for r in tokens) + 1)]
run = results["runs"][0]
for label, records in [("unloaded", run["unloaded"]["requests"])] + [(p["load"]["label"], p["requests"])
                                                                      for p in run["points"]]:
    lens = [r["prompt_len"] for r in records]
    at = [o for o in range(len(order) - len(lens) + 1)
          if all(order[o + i] is not None and abs(order[o + i] - n) <= 1 for i, n in enumerate(lens))]
    if len(at) != 1:
        print(f"{label}: not matched to the timeline ({len(at)} places)")
        continue
    parts = defaultdict(list)
    for r in records:
        e = events[f"{prefix}-{at[0] + r['index']}"]
        if r["prompt_len"] < 2048 and r.get("router_ttft") and "landed" in e and "received" in e:
            inside = e["landed"] - e["received"]
            for name, s in (("ttft", r["ttft"]), ("inside", inside), ("router", r["router_ttft"] - inside),
                            ("outside", r["ttft"] - r["router_ttft"])):
                parts[name].append(1e3 * s)
    print(f"{label}: {len(parts['ttft'])} short prompts | " + " | ".join(
        f"{name} {percentile(v, 50):.2f} / {percentile(v, 90):.2f}" for name, v in parts.items()))
