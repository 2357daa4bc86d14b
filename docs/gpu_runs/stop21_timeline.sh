# Stop 21 on one H100 (issue 21): the disaggregated long-short bench of stop 20 (1P+1D at 0.5 GPU each, 300
# requests a rate) with `--timeline-dir`, then `scripts.timeline` on the workers' events: where a disaggregated
# short prompt's first token waits inside the workers, by load. The bench's results go to $OUT/ls.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
timeout 400 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg --prefill-workers 1 \
  --decode-workers 1 --gpus-per-worker 0.5 --num-requests ${N:-300} --workload long-short --input-len 128:512 \
  --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
  --rates ${RATES:-8,16,24} --slo-ttft 1 --slo-tpot 0.03 --serve-args="--timeline-dir /tmp/timeline" \
  --out $OUT/ls 2>&1 | grep -E " ok |error" | tail -6
echo "## all prompts"; python -m scripts.timeline /tmp/timeline
echo "## prompts of at most 2048 tokens"; python -m scripts.timeline /tmp/timeline --max-tokens 2048
mkdir -p $OUT/timeline && cp /tmp/timeline/*.jsonl $OUT/timeline/
find $OUT -type f ! -name "*.json" ! -name "*.jsonl" -delete; find $OUT -type f
