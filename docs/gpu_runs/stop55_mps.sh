# Stop 55 (issue 21, then 20), on a fresh machine: this machine's profile; both mixes as 1P:1D under `serve --mps`
# (decode capped at 50%) at stop 54's validation rates, for `plan --validate` with this machine's profile and the
# shipped MPS costs; then the decode step against the roofline (issue 20). Carry .gpu-deps.
KEEP=/tmp/stop55mps
source docs/gpu_runs/one_gpu_validation.sh
profile
TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
timeout $(left) python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 | grep -vi warn | tail -6
