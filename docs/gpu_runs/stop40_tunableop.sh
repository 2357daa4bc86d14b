#!/bin/bash
# Stop 40: TunableOp's algorithms for the decode GEMMs (stop40_tunableop_probe.py), then the batch-64 decode step
# with cuBLAS's own choice and with the tuned file read (PYTORCH_TUNABLEOP_TUNING=0), alternated, one H200.
#   PYTHONPATH=... bash docs/gpu_runs/stop40_tunableop.sh
set -u
export TUNED=${TUNED:-/tmp/tunableop_results.csv}
nvidia-smi --query-gpu=name,serial --format=csv,noheader
timeout 200 python docs/gpu_runs/stop40_tunableop_probe.py
step() {
  timeout 150 python -m scripts.bench_engine decode --modes graphs --batches 64 2>&1 \
    | grep -E "^graphs|copy bandwidth|Error|error" | tail -4
}
for round in 1 2; do
  echo "== round $round: cuBLAS's choice"; step
  echo "== round $round: tuned (read from $TUNED)"
  PYTORCH_TUNABLEOP_ENABLED=1 PYTORCH_TUNABLEOP_TUNING=0 PYTORCH_TUNABLEOP_FILENAME=$TUNED step
done
