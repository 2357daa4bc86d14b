# Stop 37 (issue 21): a KV worker waiting for its running step blocked in its poll while a transfer is in flight
# (common/worker/wakeup.py), against stop 36's loop polling with 50 us pauses (.ab/base), one after the other on one
# machine. Each tree serves P:D (default 1P:1D) over nccl, a GPU a worker (Qwen3-8B random weights, long-short), with
# timelines; printed: the bench's line per rate and the handoff's parts per load point (python -m scripts.timeline,
# short prompts, ms p50 / p90). TREES: the order (default: base new); P, D, RATES, N, LIMIT (s a tree), EXTRA (more
# bench flags) as named.
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name,serial --format=csv,noheader
MODEL=/tmp/qwen3-8b
PYTHONPATH=$DEPS:$PWD python -m scripts.cli prepare-model random --config qwen3-8b --out $MODEL > /dev/null 2>&1
for tree in ${TREES:-base new}; do
  dir=.; [ $tree = base ] && dir=.ab/base
  out=$OUT/$tree
  echo "## $tree"
  (cd $dir && PYTHONPATH=$DEPS:$PWD timeout ${LIMIT:-250} python -m scripts.cli bench --model $MODEL --device cuda \
    --modes disagg --prefill-workers ${P:-1} --decode-workers ${D:-1} --gpus-per-worker 1 --workload long-short \
    --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
    --rates ${RATES:-4,12,20} --num-requests ${N:-150} --slo-ttft 1 --slo-tpot 0.03 ${EXTRA:-} \
    --serve-args=--timeline-dir=$out/timeline --out $out 2>&1 | grep -E " ok |rror")
  PYTHONPATH=$DEPS:$PWD python -m scripts.timeline $out/timeline --max-tokens 2048 2>&1 | tail -40
  find $out -type f ! -name "*.json" -delete
done
