# Served first requests, colocated (no KV handoff) against disagg, warm Triton cache (a first run fills it).
export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve
timeout 150 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 fill-cache 5700 colocated > /dev/null
timeout 150 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 colocated-warm 5701 colocated
timeout 150 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 disagg-warm 5702 disagg
