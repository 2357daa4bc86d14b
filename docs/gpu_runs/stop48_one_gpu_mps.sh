# Stop 48: Qwen3-0.6B on one GPU, 1P:1D at half the GPU each, served under MPS (`serve --mps`, decode capped at
# 70% of the SMs) and time-sliced, one bench each on the same machine; MIX=ph (prefill-heavy, rates 8-64) or ls
# (long-short, 8-32). A third bench, colocated, while time is left; RUNS picks among the three (default all). Carry
# .gpu-deps; `pdcluster plan --validate` runs on the CPU afterwards against the stored profile.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
MIX=${MIX:-ph}
if [ $MIX = ph ]; then FLAGS="$PH --rates 8,16,32,48,64"; else FLAGS="$LS --rates 8,16,24,32"; fi
(while true; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader; sleep 15; done) \
  > $OUT/apps-$MIX.txt 2>&1 &
watcher=$!
served() {  # NAME MODE serve-args
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
    --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
    --modes $2 $FLAGS --out $KEEP/$MIX-$1 "--serve-args=$3" 2>&1 | grep -E " ok |rror|mps"
  cp $KEEP/$MIX-$1/results.json $OUT/q06-$MIX-$1.json 2>/dev/null
  echo "$MIX $1 done at $SECONDS s"
}
RUNS=${RUNS:-mps slices colocated}
[[ " $RUNS " == *" mps "* ]] && served mps disagg --mps
[[ " $RUNS " == *" slices "* ]] && served slices disagg ""
[[ " $RUNS " == *" colocated "* ]] && [ $(left) -gt 150 ] && served colocated colocated ""
kill $watcher
sort $OUT/apps-$MIX.txt | uniq -c | sort -rn | head -8
