# Stop 48: under a 70% MPS share, which CUDA graphs break `generate` (decode graphs off, then prompt graphs off);
# then stop48_mps_share_probe.py with the prefill side capped (its share now set before torch loads CUDA). Carry
# .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
gen s70-no-decode-graphs --cuda-graph-max-bs 0
gen s70-no-prompt-graphs --prefill-graph-max-tokens 0
for shares in 100:70 100:50; do
  echo "== MPS, decode:prefill ${shares}"; D_PCT=${shares%:*} P_PCT=${shares#*:} python docs/gpu_runs/stop48_mps_share_probe.py
done
mps_quit
