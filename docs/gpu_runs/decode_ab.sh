#!/usr/bin/env bash
# The decode step against the roofline, this tree ("new") and an older one (OLD, default .ab/old:
# docs/gpu_runs/README.md) alternated: `python -m scripts.bench_engine decode --modes graphs` at BATCHES (default
# 1,8,32,64), ORDER (default "new old new old") in one call. Sourced by the stops' A/B scripts; from the
# repository root on the GPU host,
# PYTHONPATH holding the packed dependencies.
OLD=${OLD:-.ab/old}
DEPS=$PYTHONPATH
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in ${ORDER:-new old new old}; do
  dir=$PWD; [ "$tree" = old ] && dir=$PWD/$OLD
  echo "== $tree"
  (cd "$dir" && PYTHONPATH=$DEPS:$dir python -m scripts.bench_engine decode --modes graphs \
    --batches "${BATCHES:-1,8,32,64}" 2>&1 | grep -E "^graphs |bandwidth")
done
