# Stop 22 on one H100: stop21_stalls.sh's saturating points with the router sampling its own stack while its event
# loop is late (--log-stall-stacks, common/stalls.py StallStacks): where the router is when it stalls.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
if [ "${MIX:-ph}" = ph ]; then
  WORKLOAD="--input-len 512:2048 --output-len 64:256 --slo-ttft 0.5"
else
  WORKLOAD="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 --slo-ttft 1"
fi
timeout 450 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes ${MODES:-disagg,colocated} \
  --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 \
  --num-requests ${N:-300} $WORKLOAD --rates ${RATES:-48,64} --slo-tpot 0.03 --serve-args=--log-stall-stacks \
  --out $OUT/${MIX:-ph} 2>&1 | grep -E " ok |error|stalls" | tail -12
for f in $OUT/${MIX:-ph}/*/serve-*.log $OUT/${MIX:-ph}/serve-*.log; do
  [ -f "$f" ] || continue
  echo "== $f: $(grep -c 'event loop stalled' $f) stalls logged"
  grep -A14 'event loop stalled' $f | head -120
done
find $OUT -type f ! -name "*.json" ! -name "serve-*.log" -delete; find $OUT -type f
