# Stop 24 on two GPUs (issues 21, and the disaggregated TTFT): the decode worker posts its nccl receive on the link's
# stream, no longer behind the GPU work queued on its compute stream (kvtransfer/nccl/link.py, `Link.on_stream`).
#   TESTS=1  the nccl GPU tests on this tree (TEST_K: pytest's -k, default nccl); the new receive test on the tree before (.ab/old, `git archive 45e0011`,
#            expected to fail: its receive waits) and on .ab/bug (this tree with the receive's buffers made on the
#            compute stream: `_recv_ops` makes the scratch and trailer buffers when called, not as posted; expected to fail:
#            the receive writes memory a queued kernel still reads)
#   TREES    the Qwen3-8B bench (splits.sh STEP=bench MIX LAYOUTS; MIX=ls long-short by default) on each tree
#            listed, in order; this tree's with the workers' timelines
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps); ROOT=$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
[ -f /tmp/qwen3-8b/config.json ] || (PYTHONPATH=$DEPS:$ROOT python -m scripts.cli prepare-model random --config qwen3-8b \
  --out /tmp/qwen3-8b --overwrite > /tmp/prepare.log 2>&1; echo "prepared: $(tail -1 /tmp/prepare.log)") &
if [ "${TESTS:-0}" = 1 ]; then
  echo "## this tree"; PYTHONPATH=$DEPS:$ROOT timeout 300 python -m pytest -q -p no:cacheprovider tests/test_kvtransfer_gpu.py -k ${TEST_K:-nccl} 2>&1 | grep -E "^E |passed|failed" | cut -c1-220 | tail -8
  for tree in old bug; do
    echo "## $tree (expected to fail)"; cd $ROOT/.ab/$tree
    PYTHONPATH=$DEPS:$PWD timeout 120 python -m pytest -q -p no:cacheprovider tests/test_kvtransfer_gpu.py \
      -k receive_does_not_wait 2>&1 | grep -E "^E |passed|failed" | cut -c1-220 | tail -6
  done
  cd $ROOT
fi
wait
for tree in ${TREES:-}; do
  dir=$ROOT; [ $tree = new ] || dir=$ROOT/.ab/$tree
  [ -e $dir/.gpu-deps ] || ln -s $ROOT/.gpu-deps $dir/.gpu-deps
  echo "#### $tree"
  (cd $dir && OUT=/tmp/ab-$tree STEP=bench MIX=${MIX:-ls} N=${N:-150} LAYOUTS="${LAYOUTS:-1P1D}" TIMELINE=$([ $tree = new ] && echo 1 || echo 0) \
    bash docs/gpu_runs/splits.sh 2>&1 | grep -v "^GPUS\|NVIDIA")
  for d in /tmp/ab-$tree/${MIX:-ls}/*; do  # a call brings back files at most 2 folders down
    [ -f $d/results.json ] && cp $d/results.json $OUT/$tree-${MIX:-ls}-$(basename $d).json
    [ -d $d ] && [ "${d%-timeline}" != $d ] && mkdir -p $OUT/$tree-${MIX:-ls}-$(basename $d) && cp $d/* $OUT/$tree-${MIX:-ls}-$(basename $d)/
  done
done
find $OUT -type f | sort
