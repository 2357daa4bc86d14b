# The owed GPU suites on the current tree, then the attention-grid microbenchmark (stop17_attn_grid.py).
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python -m pytest -q -m gpu tests/test_gpu_warmup.py tests/test_gpu_engine.py tests/test_flash_prefill.py tests/test_cuda_graph_shapes.py -x 2>&1 | tail -8
timeout 120 python docs/gpu_runs/stop17_attn_grid.py 16
timeout 120 python docs/gpu_runs/stop17_attn_grid.py 32
