# Two-batch overlap (common/engine/two_batch.py) against one batch: the decode step at batches 16-256, two
# engines of each alternating in one call (each warm: its own warm-up compiles every variant first), then the
# GPU tests of the overlapped graphs. Usage: bash docs/gpu_runs/stop22_two_batch.sh [BATCHES]
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
git log -1 --format='tree of %h (device copy; see docs/benchmarks.md for the tree measured)' 2>/dev/null
timeout 420 python -m scripts.bench_engine decode --modes one-batch,two-batch,one-batch,two-batch \
  --batches "${1:-16,32,64,128,256}" 2>&1 | grep -vi warn
timeout 150 python -m pytest -q -x tests/test_gpu_engine.py -k "two_batch or graphs_equal_eager" 2>&1 | tail -3
