# Stop 48: why a worker died under `serve --mps` (1P:1D at half a GPU each, Qwen3-0.6B random weights): serve
# started alone per variant, its log and the Ray workers' error output kept. Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
attempt() {  # NAME serve-flags...
  local name=$1; shift
  rm -rf /tmp/ray
  timeout 150 python -m scripts.cli serve --model /tmp/q06 --mode disagg --device cuda --prefill-workers 1 \
    --decode-workers 1 --gpus-per-worker 0.5 "$@" > $OUT/serve-$name.log 2>&1 &
  local pid=$! i
  for i in $(seq 150); do sleep 1; grep -q "serving on" $OUT/serve-$name.log && break; kill -0 $pid 2>/dev/null || break; done
  grep -q "serving on" $OUT/serve-$name.log && echo "$name: ready after $i s" || echo "$name: not ready ($i s)"
  kill -INT $pid 2>/dev/null; wait $pid
  for f in $(grep -l -E "Traceback|Error|error|CUDA" /tmp/ray/session_*/logs/worker-*.err 2>/dev/null); do
    echo "== $f"; grep -v "^\s*$" $f | tail -60; done > $OUT/workers-$name.txt
  tail -5 $OUT/workers-$name.txt
}
attempt mps --mps
attempt mps-host --mps --kv-transport host
