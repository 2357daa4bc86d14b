# After padding prefill steps to bucketed sizes: the engine GPU suites, then served first requests (warm cache).
export PYTHONUNBUFFERED=1
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_warmup.py tests/test_gpu_engine.py tests/test_kvtransfer_gpu.py -k "not two" 2>&1 | tail -3
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve
timeout 100 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 fill-cache 5700 colocated > /dev/null
timeout 100 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 colocated-warm 5701 colocated
timeout 100 python docs/gpu_runs/stop15_serve_start.py /tmp/q06 disagg-warm 5702 disagg
