#!/usr/bin/env bash
# Stop 32: the router's ceiling on the GPU host's CPU (a quiet machine of 16 cores; no GPU work), the figures
# `pdcluster plan`'s router model (scripts/planner/router_ceiling.py) is fitted to, measured on a shared 2-core VM
# before. PART=plain: one update an answer at 10/100/1000 workers, both modes; PART=stream: 10 workers, answers of
# 16 and 256 tokens, streamed and not, both modes (a streamed token's cost); PART=d1000: disaggregated at 1,000
# workers alone (PART=plain's router timed out there at start until the router capped the KV links it opens ahead).
#   PART=plain docs/gpu_runs/stop32_router_ceiling.sh      (results under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,serial --format=csv,noheader
lscpu | grep -E "Model name|^CPU\(s\)"; uptime
test -d /tmp/tiny || python -m scripts.cli prepare-model random --config tiny-qwen3 --out /tmp/tiny > /dev/null
COMMON=(--model /tmp/tiny --clients 4 --fleet-processes 8)
case "${PART:-plain}" in
  plain)
    python -m scripts.bench_router "${COMMON[@]}" > "$OUT/plain.txt" 2> "$OUT/plain.log"; cat "$OUT/plain.txt";;
  stream)
    for args in "--tokens 16" "--tokens 16 --stream" "--tokens 256 --stream --probe-rps 20"; do
      name=$(echo "$args" | tr -d ' -')
      python -m scripts.bench_router "${COMMON[@]}" --workers 10 $args > "$OUT/$name.txt" 2> "$OUT/$name.log"
      echo "== $args"; cat "$OUT/$name.txt"
    done;;
  d1000)
    python -m scripts.bench_router "${COMMON[@]}" --workers 1000 --modes disagg > "$OUT/d1000.txt" 2> "$OUT/d1000.log"; cat "$OUT/d1000.txt"; grep -c "stopped answering" "$OUT/d1000.log";;
esac
uptime
