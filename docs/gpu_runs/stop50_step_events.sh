# Stop 50, for the next GPU run: the long-short mix served as 1P:1D at half the GPU each, under MPS then time-sliced,
# with the workers' timelines, which now mark each step; `scripts.timeline` then prints each load point's decode
# steps from the decode worker's own times: beside prompt steps, and in the milliseconds after a long prompt ended.
# Is the tail after a long prompt (docs/benchmarks.md, "Stop 50") in the decode worker's GPU time? Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,32
python -m scripts.timeline $KEEP/ls-disagg-mps-timeline
TAG=slices bench ls disagg $LS --rates 8,32
python -m scripts.timeline $KEEP/ls-disagg-slices-timeline
