# Stop 25's GIL candidates on two GPUs, against this tree: .ab/fewer (a transfer waits for its last operation, not
# each, and the trailer is checked as a list: branch stop25-gil, ec0064b) and .ab/switch (that, and a GIL switch
# interval of 0.5 ms in KV workers: 5fb2d1e). Make the trees first: `git archive ec0064b | tar -x -C .ab/fewer`, the
# same for 5fb2d1e into .ab/switch; carry .ab and .gpu-deps.
#   STEP=check  the nccl GPU tests on .ab/switch, then the receive probe (stop25_gil_probe.py cuda) on each tree
#   STEP=bench  Qwen3-8B 1P:1D on the prefill-heavy mix (RATES, default 16,24,32; N=150), each tree in TREES order
#               (default: main fewer switch), with the workers' timelines; prints each run's `land` (scripts.timeline)
#               and brings back each run's results.json and decode timeline
set -u
export PYTHONUNBUFFERED=1
DEPS=${DEPS:-$(.gpu-deps/unpack .gpu-deps)}; ROOT=$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
dir_of() { [ $1 = main ] && echo $ROOT || echo $ROOT/.ab/$1; }
case ${STEP:-check} in
  check)
    (cd .ab/switch && PYTHONPATH=$DEPS:$PWD timeout 240 python -m pytest -q -p no:cacheprovider tests/test_kvtransfer_gpu.py \
      -k nccl > $OUT/switch-nccl-tests.txt 2>&1; echo "switch nccl tests rc=$?"; tail -2 $OUT/switch-nccl-tests.txt)
    for tree in ${TREES:-main fewer switch}; do
      echo "## probe $tree"
      (cd $(dir_of $tree)/docs/gpu_runs && PYTHONPATH=$DEPS:$(dir_of $tree) timeout 120 \
        python $ROOT/docs/gpu_runs/stop25_gil_probe.py ${PROBE_DEVICE:-cuda} 10 2>&1 | grep -E "resolved|rror" | tail -8)
    done;;
  bench)
    for tree in ${TREES:-main fewer switch}; do
      dir=$(dir_of $tree); [ -e $dir/.gpu-deps ] || ln -s $ROOT/.gpu-deps $dir/.gpu-deps
      echo "#### $tree"
      (cd $dir && OUT=/tmp/ab-$tree STEP=bench MIX=ph N=${N:-150} RATES=${RATES:-16,24,32} LAYOUTS=1P1D TIMELINE=1 \
        bash docs/gpu_runs/splits.sh 2>&1 | grep -v "^GPUS\\|NVIDIA")
      cp /tmp/ab-$tree/ph/1P1D/results.json $OUT/$tree-ph-1P1D.json 2>/dev/null
      mkdir -p $OUT/$tree-timeline && cp /tmp/ab-$tree/ph/1P1D-timeline/d0.jsonl $OUT/$tree-timeline/ 2>/dev/null
      PYTHONPATH=$DEPS:$ROOT python -m scripts.timeline /tmp/ab-$tree/ph/1P1D-timeline 2>&1 | cut -d'|' -f1,2,8,10
    done;;
esac
find $OUT -type f | sort
