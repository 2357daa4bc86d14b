# Stop 48: the GPU tests of the kernels and of graphs against eager, as an MPS client capped at 70% of the SMs (92
# seen), stopping at the first failure: which captured piece goes wrong under the cap. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout ${LIMIT:-300} python -m pytest -m gpu -x -q -p no:cacheprovider \
  --tb=short tests/test_fused.py tests/test_head_sampler.py tests/test_gpu_engine.py -k "not tensor_parallel" 2>&1 \
  | grep -v "^\s*$" | grep -v Warning | tail -40
mps_quit
