export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve
timeout 250 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 cold 5701
timeout 250 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 warm 5702
