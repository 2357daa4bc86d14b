# Stop 49: under MPS at a 70% share, the fused head's kernel alone from a CUDA graph (stop49_head_sampler_probe.py)
# and `generate` with this tree's fusion (the fused head left out under a cap); then stop 48's prefill-heavy benches
# of branch stop48-mps (serve --mps, 1P:1D time-sliced, colocated). Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
for share in 70 100; do
  echo "== probe at $share%"
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share timeout 150 python docs/gpu_runs/stop49_head_sampler_probe.py 2>&1 | tail -16
done
gen tree
mps_quit
echo "probes done at $SECONDS s"
MIX=ph source docs/gpu_runs/stop48_one_gpu_mps.sh
