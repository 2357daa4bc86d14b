# Stop 30 on four GPUs (nvidia-h200-x4 or nvidia-h100-x4): the planner's first check past two GPUs. Qwen3-8B
# (random weights), one GPU a worker, every layout splits.sh runs, one `pdcluster bench` each, against predictions
# committed before the call (docs/benchmarks.md, "Stop 30").
#   MIX      ls (long-short, rates 16-64 req/s: the planner's picks part there), ph (prefill-heavy) or cc (the
#            chat/coding traces; carry .traces), these two at splits.sh's rates
#   LAYOUTS  which, in order (default: the pick first, then its rivals). Each runs under a timeout of at most 200 s
#            that ends by END seconds (default 580), and starts only with 110 s left, so that what ran comes back
#            within a call's 10 minutes
# Carry .gpu-deps. Each layout's results.json comes back as $OUT/$MIX-<layout>.json (8 files at most a call);
# `pdcluster plan --validate` runs on the CPU afterwards, against the stored profile of the machine's kind.
set -u
KEEP=/tmp/stop30
mkdir -p $KEEP
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps 2>/dev/null || true):$PWD PYTHONUNBUFFERED=1
export CONFIG=${CONFIG:-qwen3-8b}  # DEVICE=cpu CONFIG=tiny-qwen3 GPUS=4 (and splits.sh's WORKLOAD_ARGS): a dry run
MIX=${MIX:-ls}
export N=${N:-200}
[ $MIX = ls ] && export RATES=${RATES:-16,32,48,64}
END=${END:-580}
nvidia-smi --query-gpu=name,serial --format=csv,noheader 2>/dev/null | tee $OUT/gpus.txt
[ -f /tmp/$CONFIG/config.json ] || python -m scripts.cli prepare-model random --config $CONFIG \
  --out /tmp/$CONFIG --overwrite > /dev/null 2>&1
echo "model ready at $SECONDS s"
for l in ${LAYOUTS:-3P1D colo 2P2D 1P3D 3P1D-auto}; do
  left=$((END - SECONDS)); [ $left -gt 200 ] && left=200
  if [ $left -lt 110 ]; then echo "## $l: no room left at $SECONDS s"; continue; fi
  start=$SECONDS
  OUT=$KEEP LIMIT=$left STEP=bench MIX=$MIX LAYOUTS=$l bash docs/gpu_runs/splits.sh 2>&1 | grep -v "^GPUS\|NVIDIA"
  cp $KEEP/$MIX/$l/results.json $OUT/$MIX-$l.json 2>/dev/null && echo "## $l: $((SECONDS - start)) s"
done
echo "done at $SECONDS s"; ls $OUT
