# Stop 33 (issue 20): the engine on this tree against stop 32's (.ab/base, `git archive 36f0f65`; carry .ab), on one
# machine, alternated: the decode step table at batch 1 and 64 twice each, then the offline throughput command once
# each. The only engine change between them is the scheduler's partition (common/engine/scheduler.py).
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps); ROOT=$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
lscpu | grep -E "Model name"
for round in 1 2; do
  for tree in new base; do
    dir=$ROOT; [ $tree = base ] && dir=$ROOT/.ab/base
    (cd $dir && PYTHONPATH=$DEPS:$dir timeout 100 python -m scripts.bench_engine decode --modes graphs --batches 1,64 \
      2>&1 | grep -E "^graphs +[0-9]" | sed "s/^/$tree round $round: /")
  done
done
for tree in new base; do
  dir=$ROOT; [ $tree = base ] && dir=$ROOT/.ab/base
  (cd $dir && PYTHONPATH=$DEPS:$dir timeout 100 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 \
    | grep -E "^pdcluster" | sed "s/^/$tree: /")
done
