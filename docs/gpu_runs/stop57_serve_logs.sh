# Stop 57 (issue 20): `serve` start-up on a fresh H200, its logs kept: colocated with a cold Triton cache, then warm, then
# disaggregated warm (stop16_serve_start.py's three starts, no requests). Carry .gpu-deps.
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve57
for run in colocated-cold:colocated colocated-warm:colocated disagg-warm:disagg; do
  label=${run%%:*}; mode=${run##*:}
  t0=$(date +%s.%N); echo "$label started at $(date +%H:%M:%S.%N | cut -c1-12)"
  timeout 80 python -m scripts.cli serve --model /tmp/q06 --device cuda --gpus-per-worker 0.5 --mode $mode --workers 2 \
    --bind tcp://127.0.0.1:$((20000 + RANDOM % 20000)) > $OUT/serve-$label.log 2>&1 &
  pid=$!
  while ! grep -q "serving on" $OUT/serve-$label.log; do sleep 0.1; kill -0 $pid || break; done
  echo "$label ready after $(python -c "print(round($(date +%s.%N) - $t0, 1))") s"
  sleep 2; kill -INT $pid; wait $pid
done
