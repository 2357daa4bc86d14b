# Stop 55 (issue 21): how far the served figures move between two identical runs on one machine: long-short as
# 1P:1D under `serve --mps` (the mix whose TTFT p90 cells missed 15% in stop55_mps.sh), the same flags and seed
# twice, each with its own `serve`. Carry .gpu-deps.
KEEP=/tmp/stop55rep
source docs/gpu_runs/one_gpu_validation.sh
TAG=mps1 SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
TAG=mps2 SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
