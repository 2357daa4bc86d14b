# serve start-up with a cold and a warm Triton cache, colocated and disaggregated, and the first requests' TTFT.
export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve16
timeout 120 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-cold 5701 colocated
timeout 120 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-warm 5702 colocated
timeout 120 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 disagg-warm 5703 disagg
timeout 120 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-warm2 5704 colocated
