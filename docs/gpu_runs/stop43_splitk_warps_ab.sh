#!/usr/bin/env bash
# Stop 43 (issue 20): the decode step against the roofline with split-K's partial kernel at 8 warps (this tree)
# and at 4 (OLD, default .ab/old: stop 42's final tree, as docs/gpu_runs/README.md says), alternated
# new / old / new / old in one call. From the repository root on the GPU host, PYTHONPATH holding the packed
# dependencies (docs/gpu_runs/README.md).
set -uo pipefail
OLD=${OLD:-.ab/old}
DEPS=$PYTHONPATH
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in new old new old; do
  dir=$PWD; [ "$tree" = old ] && dir=$PWD/$OLD
  echo "== $tree"
  (cd "$dir" && PYTHONPATH=$DEPS:$dir python -m scripts.bench_engine decode --modes graphs --batches 1,8,32,64 2>&1 \
    | grep -E "^graphs |bandwidth")
done
