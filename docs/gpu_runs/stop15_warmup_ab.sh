#!/usr/bin/env bash
# One call: warm-up GPU tests, startup bench (new tree), throughput A/B old vs new with fresh Triton caches.
set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD
python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_warmup.py 2>&1 | tail -4
echo "== bench_startup (new tree)"
timeout 200 python -m scripts.bench_startup --requests 120 2>&1 | grep -v Warning | tail -8
for label in cold warm; do
  for tree in old new; do
    dir=$ROOT; [ $tree = old ] && dir=$ROOT/.ab/old
    echo "== throughput, $tree tree, $label Triton cache"
    (cd $dir && TRITON_CACHE_DIR=/tmp/tc_$tree PYTHONPATH=$DEPS:$dir timeout 150 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 | grep -E "pdcluster|mode|warm-up" )
  done
done
