# Stop 53: stop53_gemm_probe.py uncapped and as an MPS client at 50-90% of the SMs. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
for share in 100 70 60 80 50 90; do
  echo "== share $share"
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 60 python docs/gpu_runs/stop53_gemm_probe.py 2>&1 | head -14
done
mps_quit
