# Stop 19 on one H100 (issue 21): where a served first token waits under load. The validation benches' loads that
# missed (colocated prefill-heavy 32-64 req/s, disaggregated and colocated long-short 16 and 32 req/s), with the
# bench now recording the router's own Timings per request (router_queued, router_ttft) beside the client's TTFT.
# With TRACE=1 (and LS=0 to leave out long-short), the engine-alone replay of the same loads follows on the same
# machine (stop19_step_trace.py).
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite 2>&1 | tail -1
timeout 150 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes colocated --workers 1 \
  --colocated-gpus-per-worker 1 --gpus-per-worker 0.5 --rates 32,48,64 --num-requests 120 \
  --input-len 512:2048 --output-len 64:256 --slo-ttft 0.5 --slo-tpot 0.03 --out $OUT/ph 2>&1 | grep -E " ok " | tail -4
[ "${LS:-1}" = 1 ] && timeout 230 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg,colocated --prefill-workers 1 \
  --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --workload long-short \
  --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
  --rates 16,32 --num-requests 120 --slo-ttft 1 --slo-tpot 0.03 --out $OUT/ls 2>&1 | grep -E " ok " | tail -6
[ "${TRACE:-0}" = 1 ] && timeout 120 python docs/gpu_runs/stop19_step_trace.py /tmp/q06 2>&1 | grep "req/s"
find $OUT -type f ! -name "results.json" ! -name "step_trace.json" -delete; find $OUT -type f
