#!/usr/bin/env bash
# Stop 44 (issue 20): the decode step against the roofline with the LM head and sampler replayed as a CUDA graph
# (this tree) and run eagerly (OLD, default .ab/old: stop 43's final tree, c58acc1), alternated
# ORDER="new old new old new old new old new old" at BATCHES=1,64 in one call. From the repository root on the
# GPU host, PYTHONPATH holding the packed dependencies (docs/gpu_runs/README.md).
set -uo pipefail
ORDER=${ORDER:-new old new old new old new old new old} BATCHES=${BATCHES:-1,64}
. docs/gpu_runs/decode_ab.sh
