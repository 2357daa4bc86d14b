# Stop 49: the blind check of the MPS contention fitted to call 3's machine, on a fresh one: its own profile, then
# 1P:1D under `serve --mps` on both mixes (stop49_blind_mps.sh without its colocated bench); then, while time is
# left, the profile again as an MPS client at the decode worker's 70% share of the SMs (its decode steps alone under
# the cap), and a colocated prefill-heavy bench. Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
profile
RUNS=mps MIX=ph source docs/gpu_runs/stop48_one_gpu_mps.sh
RUNS=mps MIX=ls source docs/gpu_runs/stop48_one_gpu_mps.sh
source docs/gpu_runs/stop48_mps_client.sh
if [ $(left) -gt 90 ]; then
  mps_start
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout $(left) python -m scripts.cli profile --model /tmp/q06 --device cuda \
    --model-name Qwen3-0.6B --out $OUT/q06-profile-mps70.json > $OUT/q06-fits-mps70.txt 2> $OUT/q06-progress-mps70.txt
  echo "capped profile rc=$? at $SECONDS s"
  mps_quit
fi
RUNS=colocated MIX=ph source docs/gpu_runs/stop48_one_gpu_mps.sh
