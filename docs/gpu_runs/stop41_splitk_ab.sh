#!/usr/bin/env bash
# Stop 41 (issue 20): the decode step against the roofline with o and down as split-K Triton kernels (this tree) and
# as cuBLAS's (OLD: the tree before, default .ab/old as docs/gpu_runs/README.md says; the stop's run had it at
# .ab_old), alternated new / old / new / old in one call; then the GPU tests of the layers and the engine. From the
# repository root on the GPU host, PYTHONPATH holding the packed dependencies (docs/gpu_runs/README.md).
set -uo pipefail
. docs/gpu_runs/decode_ab.sh
PYTHONPATH=$DEPS:$PWD python -m pytest -p no:cacheprovider -m gpu -q tests/test_fused.py tests/test_gpu_engine.py \
  tests/test_gpu_warmup.py tests/test_upload.py 2>&1 | tail -4
