# Stop 58 (issues 20, 21) on nvidia-h200-x2, the runs stop 57 owed. Carry .gpu-deps.
#   STEP=1  the two-GPU group: cuda_ipc and nccl transports, clusters on two GPUs, the two-node pair
#   STEP=2  the one-GPU engine tests on the timed ModelRunner (tensor parallelism among them, on both GPUs)
#   STEP=ls, STEP=ph  issue 21's Qwen3-8B validation: 1P:1D and two colocated replicas (splits.sh, 150 a rate)
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
gpu_tests() { timeout ${LIMIT:-560} python -m pytest -q -p no:cacheprovider -m gpu "$@" 2>&1 | tail -12; }
case ${STEP:-1} in
  1) gpu_tests tests/test_kvtransfer_gpu.py tests/test_multinode_gpu.py;;
  2) gpu_tests tests/test_gpu_engine.py tests/test_gpu_warmup.py;;
  ls|ph) mix=$STEP; OUT=$OUT N=150 STEP=bench MIX=$mix LAYOUTS="1P1D colo" bash docs/gpu_runs/splits.sh;;
esac
