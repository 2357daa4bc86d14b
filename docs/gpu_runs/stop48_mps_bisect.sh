# Stop 48: which Triton path of the decode graphs fails under a 70% MPS share: `generate` with one of the layers'
# Triton modules turned off (fusion.py then serves the torch path), one at a time. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
for off in ${OFF:-head_sampler splitk fused gemv}; do
  PATCH="from common.engine.layers import fusion; fusion._loaded['$off'] = None" gen off-$off
done
mps_quit
