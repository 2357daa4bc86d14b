# Stop 50: the long-short mix under `serve --mps` with the long requests asking for one token, so that none of them
# sits in a decode batch: do decode steps still slow down for ~20 ms after a long prompt ends? Timelines kept for
# docs/gpu_runs/stop50_mps_gaps.py. Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
LS1=${LS/--long-output-len 4:16/--long-output-len 1:1}
timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
  --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
  --modes disagg $LS1 --rates 8,32 --out $KEEP/ls1 "--serve-args=--mps --timeline-dir=$KEEP/ls1-timeline" 2>&1 \
  | grep -E " ok |rror"
cp $KEEP/ls1/results.json $OUT/q06-ls1-mps.json
tar -czf $OUT/q06-ls1-mps-timeline.tgz -C $KEEP ls1-timeline
