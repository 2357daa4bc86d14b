# Stop 48: stop48_mps_graph_probe.py at 100% and 70% MPS shares, then `generate` at 70% with cuBLASLt kept out of
# addmm, and with cuBLAS given no workspace. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
for share in 100 70; do
  echo "== share $share"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 python docs/gpu_runs/stop48_mps_graph_probe.py 2>&1 | grep -v Warn
done
DISABLE_ADDMM_CUDA_LT=1 gen no-lt
CUBLAS_WORKSPACE_CONFIG=:0:0 gen no-workspace
mps_quit
