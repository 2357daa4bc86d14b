# Stop 22 on one GPU (issue 21): the long-short mix at its saturating rates, where the client's TTFT ran up to
# 185 ms past the router's with no loop stall in either process; the CPU of every thread of the bench and serve
# processes sampled beside it (stop22_cpu_sampler.py), the bench's lines stamped with the same wall clock.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader; nproc
timeout ${LIMIT:-400} python -m scripts.cli bench --model /tmp/q06 --device cuda --modes ${MODES:-colocated,disagg} \
  --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 \
  --num-requests ${N:-300} --workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 \
  --long-output-len 4:16 --long-fraction 0.2 --rates ${RATES:-24,32} --slo-ttft 1 --slo-tpot 0.03 \
  --out $OUT/ls > /tmp/bench.log 2>&1 &
BENCH=$!
python docs/gpu_runs/stop22_cpu_sampler.py $BENCH $OUT/cpu.txt &
while kill -0 $BENCH 2>/dev/null; do
  sleep 0.5
  grep -E " ok |rror" /tmp/bench.log | while IFS= read -r l; do grep -qF "$l" /tmp/seen 2>/dev/null || { echo "$(date +%s.%N | cut -c1-12) $l"; echo "$l" >> /tmp/seen; }; done
done
wait
python docs/gpu_runs/stop22_client_router.py $OUT/ls/results.json ls
echo "## threads over a third of a core, half-second windows"; cat $OUT/cpu.txt | cut -c1-260 | head -150
find $OUT -type f ! -name results.json ! -name cpu.txt -delete; find $OUT -type f
