# Stop 20 on one H100 (issue 21): the two validation benches of stops 18-19 with 300 requests a rate (120 before:
# near saturation that did not pin a p90), the bench recording the router's Timings (queued, reserved, ttft) with
# each request. MIX=ph (prefill-heavy) or MIX=ls (long-short), one per call, the second on the machine the first
# left warm; PROFILE=1 first measures this machine's profile, so that the planner is judged on the GPU it ran on.
# `pdcluster plan --validate` then runs on the CPU.
set -u
# EXTRA: more bench flags (stop21_validate.sh passes the timeline and the unloaded requests).
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite 2>&1 | tail -1
if [ "${PROFILE:-0}" = 1 ]; then
  timeout 170 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
    --out $OUT/h100-q06.json > /dev/null 2> $OUT/progress.txt; tail -1 $OUT/progress.txt
fi
nvidia-smi --query-gpu=name,pci.bus_id,serial --format=csv,noheader
COMMON="--model /tmp/q06 --device cuda --modes disagg,colocated --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests ${N:-300} ${EXTRA:-}"
if [ "${MIX:-ph}" = ph ]; then
  timeout 560 python -m scripts.cli bench $COMMON --rates 8,16,32,48,64 --input-len 512:2048 --output-len 64:256 \
    --slo-ttft 0.5 --slo-tpot 0.03 --out $OUT/ph 2>&1 | grep -E " ok |error" | tail -14
else
  timeout 560 python -m scripts.cli bench $COMMON --workload long-short --input-len 128:512 --output-len 128:512 \
    --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 --rates 8,16,24,32 --slo-ttft 1 \
    --slo-tpot 0.03 --out $OUT/ls 2>&1 | grep -E " ok |error" | tail -12
fi
find $OUT -type f ! -name "*.json" ! -name "*.jsonl" -delete; find $OUT -type f
