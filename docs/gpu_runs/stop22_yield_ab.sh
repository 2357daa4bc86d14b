# Stop 22 on one GPU: the router's socket loops and the client's reader give the event loop up after each message
# (router/sockets.py, router/client/aio.py) against the tree before (.ab/old, `git archive 4712167`, carried). The
# prefill-heavy mix at the rates where the router's loop stalled (stop 21), both modes, old tree first; per point
# the router's and the client's loop stalls and the client's TTFT minus the router's (stop22_client_router.py), and
# the stack the router's loop was in at each stall (--log-stall-stacks).
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps)
ROOT=$PWD
PYTHONPATH=$DEPS:$ROOT python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in ${TREES:-old new}; do
  dir=$ROOT; [ $tree = old ] && dir=$ROOT/.ab/old
  cd $dir
  export PYTHONPATH=$DEPS:$dir
  echo "#### $tree"
  timeout ${LIMIT:-270} python -m scripts.cli bench --model /tmp/q06 --device cuda --modes ${MODES:-colocated,disagg} \
    --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 \
    --num-requests ${N:-300} --input-len 512:2048 --output-len 64:256 --slo-ttft 0.5 --slo-tpot 0.03 \
    --rates ${RATES:-48,64} --serve-args=--log-stall-stacks --out $OUT/$tree 2>&1 | grep -E " ok |rror|stalls"
  PYTHONPATH=$DEPS:$ROOT python $ROOT/docs/gpu_runs/stop22_client_router.py $OUT/$tree/results.json $tree
  for f in $(find $OUT/$tree -name "serve-*.log"); do
    echo "== $tree $(basename $(dirname $f))/$(basename $f): $(grep -c 'event loop stalled' $f) stalls logged"
    grep -A9 'event loop stalled' $f | grep -E "stalled|File" | sed 's/^ *//' | cut -c1-150 | head -40
  done
done
cd $ROOT
find $OUT -type f ! -name results.json -delete; find $OUT -type f
