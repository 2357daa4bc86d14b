#!/usr/bin/env bash
# Stop 42 (issue 20): the decode step against the roofline with o's and down's split-K parts summed by the
# add+RMSNorm after them and SiLU-and-mul launched with PDL (this tree) and as stop 41 left it (OLD, default
# .ab/old, as docs/gpu_runs/README.md says), alternated new / old / new / old in one call; then the probe of each
# change (stop42_fold_probe.py) and, with TESTS=1, the GPU tests of the layers, the attention kernels and the engine.
# From the repository root on the GPU host, PYTHONPATH holding the packed dependencies (docs/gpu_runs/README.md).
set -uo pipefail
. docs/gpu_runs/decode_ab.sh
PYTHONPATH=$DEPS:$PWD python docs/gpu_runs/stop42_fold_probe.py 2>&1 | grep -E "^decode|H200|H100"
[ "${TESTS:-0}" = 1 ] && PYTHONPATH=$DEPS:$PWD python -m pytest -p no:cacheprovider -m gpu -q tests/test_fused.py \
  tests/test_gpu_engine.py tests/test_gpu_warmup.py tests/test_upload.py tests/test_kernels_compile.py \
  tests/test_triton_ops.py 2>&1 | tail -6
