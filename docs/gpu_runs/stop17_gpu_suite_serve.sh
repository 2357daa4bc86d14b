# Prompt graphs in the tree: every GPU suite, then serve start-up and the first requests' TTFT (as stop 16's).
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_warmup.py tests/test_gpu_engine.py tests/test_flash_prefill.py tests/test_cuda_graph_shapes.py 2>&1 | grep -E "passed|failed|FAILED|Error" | tail -8
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve17
timeout 70 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-cold 5701 colocated
timeout 70 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-warm 5702 colocated
timeout 70 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 disagg-warm 5703 disagg
timeout 70 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-warm2 5704 colocated
