# Stop 58: the rare handoff stall (stops 55-56: a prefill worker's cuda_ipc send held 248-272 ms, 2 in about 8,000
# handoffs). Qwen3-0.6B as 1P:1D under `serve --mps` on one GPU, 1,000 requests a rate on both mixes, with the
# workers' timelines: their pause marks (a full collection, the timeline's own write) and each send's own time say
# whether a long send is the transport or its process. Carry .gpu-deps.
#   STEP=1  both mixes at two rates each (call 6)
#   STEP=2  the cuda_ipc tests on one GPU (a copy times itself), then prefill-heavy at three rates, each send's long
#           time broken down (its wait for the copy, the copy's GPU time, the thread's CPU time)
KEEP=/tmp/stop58; N=${N:-1000}
source docs/gpu_runs/one_gpu_validation.sh
if [ "${STEP:-1}" = 2 ]; then
  timeout 120 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kvtransfer_gpu.py -k "cuda_ipc and not two_gpus" \
    2>&1 | tail -3
  SERVE=--mps bench ph disagg $PH --rates 16,24,32 --unloaded-requests 0
  python -m scripts.timeline $KEEP/ph-disagg-timeline 2>&1 | head -60
  exit
fi
SERVE=--mps bench ph disagg $PH --rates 16,32 --unloaded-requests 0
SERVE=--mps bench ls disagg $LS --rates 16,24 --unloaded-requests 0
for m in ph ls; do echo "## $m"; python -m scripts.timeline $KEEP/$m-disagg-timeline 2>&1 | head -60; done
