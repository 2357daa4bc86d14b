# Stop 49: a blind check of the simulator's MPS contention (fitted to calls 1-2's machine) on a fresh machine: its
# own profile (`pdcluster profile`), then 1P:1D under `serve --mps` on both mixes, and a colocated prefill-heavy
# bench while time is left. `mps_contention` is copied into the new profile on the CPU before `plan --validate`.
# Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
profile
RUNS=mps MIX=ph source docs/gpu_runs/stop48_one_gpu_mps.sh
RUNS=mps MIX=ls source docs/gpu_runs/stop48_one_gpu_mps.sh
RUNS=colocated MIX=ph source docs/gpu_runs/stop48_one_gpu_mps.sh
