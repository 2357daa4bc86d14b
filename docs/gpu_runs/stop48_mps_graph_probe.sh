# Stop 48: stop48_mps_graph_probe.py at 100% and 70% MPS shares, then `generate` at 70% with cuBLASLt kept out of
# addmm, and with cuBLAS given no workspace. Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
for share in 100 70; do
  echo "== share $share"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 python docs/gpu_runs/stop48_mps_graph_probe.py 2>&1 | grep -v Warn
done
gen() {  # NAME: generate at 70%, in the environment given
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout 100 python -m scripts.cli generate --model /tmp/q06 --device cuda \
    --gpu-memory-utilization 0.3 --prompt "hello there" --max-tokens 8 --json > $KEEP/gen-$1.log 2>&1
  echo "$1: rc=$? $(grep -c Assertion $KEEP/gen-$1.log) assertions; $(grep -E '^\{' $KEEP/gen-$1.log | cut -c1-90)"
}
DISABLE_ADDMM_CUDA_LT=1 gen no-lt
CUBLAS_WORKSPACE_CONFIG=:0:0 gen no-workspace
echo quit | nvidia-cuda-mps-control
