# Stop 58: the rare handoff stall (stops 55-56: a prefill worker's cuda_ipc send held 248-272 ms, 2 in about 8,000
# handoffs). Qwen3-0.6B as 1P:1D under `serve --mps` on one GPU, 1,000 requests a rate on both mixes, with the
# workers' timelines: their pause marks (a full collection, the timeline's own write) and each send's own time say
# whether a long send is the transport or its process. Carry .gpu-deps.
KEEP=/tmp/stop58; N=${N:-1000}
source docs/gpu_runs/one_gpu_validation.sh
SERVE=--mps bench ph disagg $PH --rates 16,32 --unloaded-requests 0
SERVE=--mps bench ls disagg $LS --rates 16,24 --unloaded-requests 0
for m in ph ls; do echo "## $m"; python -m scripts.timeline $KEEP/$m-disagg-timeline 2>&1 | head -60; done
