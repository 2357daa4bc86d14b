# Stop 21 on one H100: the long-short bench of stop21_validate.sh at its saturating rates, where the client's TTFT ran
# hundreds of ms past the router's; the bench now records its own and the router's event-loop stalls and full GCs
# per point (common/stalls.py) and prints them after each summary line.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
# MIX=ph: the prefill-heavy mix instead (RATES then e.g. 32,48,64).
if [ "${MIX:-ls}" = ph ]; then
  WORKLOAD="--input-len 512:2048 --output-len 64:256 --slo-ttft 0.5"
else
  WORKLOAD="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 --slo-ttft 1"
fi
timeout 500 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes ${MODES:-colocated,disagg} \
  --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 \
  --num-requests ${N:-300} $WORKLOAD --rates ${RATES:-16,24,32} --slo-tpot 0.03 \
  --out $OUT/${MIX:-ls} 2>&1 | grep -E " ok |error" | tail -8
find $OUT -type f ! -name "*.json" -delete; find $OUT -type f
