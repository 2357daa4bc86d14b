# stop15_policy.sh again, after auto's chunk cost, budget and TPOT guard (router/disagg_policy.py): the same load,
# plus the router's count of prompts prefilled on the decode worker per rate.
set -u
export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
timeout 560 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg:always,disagg:auto,colocated \
  --prefill-workers 1 --decode-workers 1 --workers 2 --gpus-per-worker 0.5 --rates 8,16,32 --num-requests 150 \
  --input-len 100:1024 --output-len 100:512 --slo-ttft 0.5 --slo-tpot 0.05 --out $OUT/policy 2>&1 \
  | grep -E " ok |reading|wrote .*report|SLO|prefilled on the decode worker" | tail -40
