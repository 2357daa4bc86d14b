#!/usr/bin/env bash
# Stop 43 (issue 20): the decode step against the roofline with split-K's partial kernel at 8 warps (this tree)
# and at 4 (OLD, default .ab/old: stop 42's final tree, as docs/gpu_runs/README.md says), alternated
# new / old / new / old in one call; the second call's four pairs were `ORDER="new old new old new old new old"
# BATCHES=8,32,64` of the same loop. From the repository root on the GPU host, PYTHONPATH holding the packed
# dependencies (docs/gpu_runs/README.md).
set -uo pipefail
. docs/gpu_runs/decode_ab.sh
