# Stop 28 on one GPU (nvidia-h200): stop 27's one-GPU runs again on a fresh machine, a blind check of stop 28's
# simulator (one_gpu_validation.sh).
#   STEP=ph  this machine's profile by this tree's profiler ($OUT/q06-profile.json, kept in /tmp/stop28 for the
#            next call), then the prefill-heavy validation bench (rates 8-64), one bench a mode
#   STEP=ls  the long-short validation bench (rates 8-32), one bench a mode; then the arrival probe
#            (docs/gpu_runs/stop28_arrival_probe.py) on this machine
#   STEP=rerun  the cells beyond 15% again with 300 requests a rate, on another machine with its own profile:
#            prefill-heavy colocated at 48 and 64 req/s, long-short disaggregated at 24 and 32
# Carry .gpu-deps. `pdcluster plan --validate` runs on the CPU afterwards.
KEEP=/tmp/stop28
[ "${STEP:-ph}" = rerun ] && N=300
source docs/gpu_runs/one_gpu_validation.sh
case ${STEP:-ph} in
  ph)
    profile
    for mode in disagg colocated; do bench ph $mode $PH --rates 8,16,32,48,64; done;;
  ls)
    for mode in disagg colocated; do bench ls $mode $LS --rates 8,16,24,32; done
    timeout $(left) python docs/gpu_runs/stop28_arrival_probe.py /tmp/q06 40 2>&1 | grep -v Warning \
      > $OUT/arrival-probe.txt; tail -9 $OUT/arrival-probe.txt;;
  rerun)
    profile
    bench ph colocated $PH --rates 48,64
    bench ls disagg $LS --rates 24,32;;
esac
echo "done at $SECONDS s"; find $OUT -type f | sort
