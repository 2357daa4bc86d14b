# Stop 50: the long-short mix served as 1P:1D under MPS at three settings of the SM shares, each with the workers'
# timelines, for docs/gpu_runs/stop50_mps_gaps.py: does a decode step with a long request in its batch stay slow with
# the decode worker uncapped, or with the two shares adding up to 100%? Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
served() {  # NAME serve-args
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
    --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
    --modes disagg $LS --rates 8,32 --out $KEEP/ls-$1 "--serve-args=$2 --timeline-dir=$KEEP/ls-$1-timeline" 2>&1 \
    | grep -E " ok |rror"
  cp $KEEP/ls-$1/results.json $OUT/q06-ls-$1.json
  tar -czf $OUT/q06-ls-$1-timeline.tgz -C $KEEP ls-$1-timeline
  echo "ls $1 done at $SECONDS s"
}
served mps70 --mps
served mps100 "--mps --mps-shares decode=100"
served mps70-30 "--mps --mps-shares decode=70,prefill=30"
