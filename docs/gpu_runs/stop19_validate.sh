# Stop 19 on one H100 (the decode plan of a wave and a half; profile decode points over spread contexts): the two
# validation benches of stop 18 (120 requests a rate) on this tree, for `pdcluster plan --validate` on the CPU
# against the profile from stop19_plan_ab.sh; then the step trace of the colocated points on this engine
# (stop19_step_trace.py), to cost its batches on the CPU.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
timeout 215 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg,colocated --prefill-workers 1 --decode-workers 1 \
  --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --rates 8,16,32,48,64 --num-requests 120 \
  --input-len 512:2048 --output-len 64:256 --slo-ttft 0.5 --slo-tpot 0.03 --out $OUT/q06-prefill-heavy 2>&1 | grep -E " ok " | tail -12
timeout 215 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg,colocated --prefill-workers 1 --decode-workers 1 \
  --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --workload long-short --input-len 128:512 \
  --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
  --rates 8,16,24,32 --num-requests 120 --slo-ttft 1 --slo-tpot 0.03 --out $OUT/q06-long-short 2>&1 | grep -E " ok " | tail -12
timeout 120 python docs/gpu_runs/stop19_step_trace.py /tmp/q06 2>&1 | grep "req/s"
find $OUT -type f ! -name "*.json" -delete; find $OUT -type f
