#!/usr/bin/env bash
# Stop 46 (issue 20): the decode step against the roofline with a decode batch's LM head and sampler in one kernel
# and the sampler's logs through lg2.approx (this tree) and without (OLD, default .ab/old: stop 45's final tree,
# 54b1399), alternated new / old / new / old in one call. From the repository root on the GPU host, PYTHONPATH
# holding the packed dependencies (docs/gpu_runs/README.md).
set -uo pipefail
. docs/gpu_runs/decode_ab.sh
