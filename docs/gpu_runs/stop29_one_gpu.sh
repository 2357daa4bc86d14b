# Stop 29 on one GPU (nvidia-h200): a blind check of stop 29's simulator (the decode worker's launch from a decode
# step's start) on a fresh machine (one_gpu_validation.sh): this machine's profile by this tree's profiler, then
# the validation benches, one bench a mode.
#   STEP=all     prefill-heavy (rates 8-64) and long-short (8-32), both modes (call 1: 12 files, more than a call
#                brings back; the first tree also timed each decode point's GPU time, which its fits.txt shows)
#   STEP=disagg  the same, disaggregated only: stop 29's change moves no colocated prediction
#   STEP=moved   the cells it moved most, with 300 requests a rate: prefill-heavy at 8 and 16 req/s, long-short at 24
#                and 32, disaggregated
# Carry .gpu-deps. `pdcluster plan --validate` runs on the CPU afterwards.
KEEP=/tmp/stop29
[ "${STEP:-all}" = moved ] && N=300
source docs/gpu_runs/one_gpu_validation.sh
profile
if [ "${STEP:-all}" = moved ]; then
  bench ph disagg $PH --rates 8,16
  bench ls disagg $LS --rates 24,32
  echo "done at $SECONDS s"; find $OUT -type f | sort; exit 0
fi
modes="disagg colocated"
[ "${STEP:-all}" = disagg ] && modes=disagg
for mode in $modes; do bench ph $mode $PH --rates 8,16,32,48,64; done
for mode in $modes; do bench ls $mode $LS --rates 8,16,24,32; done
echo "done at $SECONDS s"; find $OUT -type f | sort
