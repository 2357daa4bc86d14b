# Stop 50, for the next GPU run: the long-short mix served as 1P:1D at half the GPU each, under MPS then time-sliced,
# with the workers' timelines, which now mark each step; `scripts.timeline` then prints each load point's decode
# steps from the decode worker's own times: beside prompt steps, and in the milliseconds after a long prompt ended.
# Is the tail after a long prompt (docs/benchmarks.md, "Stop 50") in the decode worker's GPU time? Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
served() {  # NAME serve-args
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
    --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
    --modes disagg $LS --rates 8,32 --out $KEEP/steps-$1 "--serve-args=$2 --timeline-dir=$KEEP/steps-$1-timeline" \
    2>&1 | grep -E " ok |rror"
  python -m scripts.timeline $KEEP/steps-$1-timeline
  cp $KEEP/steps-$1/results.json $OUT/q06-steps-$1.json
  tar -czf $OUT/q06-steps-$1-timeline.tgz -C $KEEP steps-$1-timeline
}
served mps --mps
served slices ""
