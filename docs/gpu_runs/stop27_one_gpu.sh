# Stop 27 on one GPU (nvidia-h200): Qwen3-0.6B, 1P:1D at half the GPU each against one colocated replica, each
# mode served with its timelines (`serve --timeline-dir`), so how the two engines share the GPU can be read off
# (one_gpu_validation.sh).
#   STEP=ph  this machine's profile by this tree's profiler ($OUT/q06-profile.json, kept in /tmp/stop27 for the
#            next call), then the prefill-heavy validation bench (rates 8-64), one bench a mode
#   STEP=ls  the long-short validation bench (rates 8-32), one bench a mode; then the decode step table alone
#            (issue 20's batch 1 and 64, nothing else on the GPU)
# Carry .gpu-deps. `pdcluster plan --validate` runs on the CPU afterwards.
KEEP=/tmp/stop27
source docs/gpu_runs/one_gpu_validation.sh
case ${STEP:-ph} in
  ph)
    profile
    for mode in disagg colocated; do bench ph $mode $PH --rates 8,16,32,48,64; done;;
  ls)
    for mode in disagg colocated; do bench ls $mode $LS --rates 8,16,24,32; done
    timeout $(left) python -m scripts.bench_engine decode --modes graphs --batches 1,64 > $OUT/decode-step.txt 2>&1
    tail -6 $OUT/decode-step.txt;;
esac
echo "done at $SECONDS s"; find $OUT -type f | sort
