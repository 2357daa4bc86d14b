# Prompt CUDA graphs: the GPU tests, then the A/B of stop17_prefill_graph_ab.py on Qwen3-0.6B and Qwen3-8B.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_engine.py -k "prefill_graphs or cuda_graphs_equal or shrink" -x 2>&1 | tail -4
timeout 150 python docs/gpu_runs/stop17_prefill_graph_ab.py qwen3-0.6b 2>&1 | grep -v Warn
timeout 200 python docs/gpu_runs/stop17_prefill_graph_ab.py qwen3-8b 2>&1 | grep -v Warn
