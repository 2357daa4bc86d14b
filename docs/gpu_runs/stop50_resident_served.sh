# Stop 50: the long-short mix served as 1P:1D at half the GPU each, time-sliced then under MPS, on one machine, each
# with the workers' timelines, for docs/gpu_runs/stop50_mps_gaps.py: is a decode step with a long request in its
# batch slower only under MPS, read from the server's side in both? Carry .gpu-deps. (Since stop 51 through the shared
# `bench`: its files are named q06-ls-disagg-TAG; when it ran they were q06-ls-TAG.)
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
TAG=slices bench ls disagg $LS --rates 8,32
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,32
