# Skinny GEMMs and PDL in the tree: the GPU suites (kernels, graphs, engine against HF, warm-up), then the decode
# step table once.
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python -m pytest -q -m gpu -p no:cacheprovider tests/test_fused.py tests/test_triton_ops.py \
  tests/test_graph_replay_triton.py tests/test_gpu_warmup.py tests/test_gpu_engine.py tests/test_cuda_graph_shapes.py \
  tests/test_prefill_graph.py 2>&1 | grep -E "passed|failed|FAILED|Error|assert" | tail -15
timeout 130 python -m scripts.bench_engine decode --modes graphs 2>&1 | grep -vi "warn" | tail -8
