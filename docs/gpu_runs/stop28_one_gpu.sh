# Stop 28 on one GPU (nvidia-h200): stop 27's one-GPU runs again on a fresh machine, a blind check of stop 28's
# simulator: Qwen3-0.6B, 1P:1D at half the GPU each against one colocated replica, each mode served with its
# timelines (`serve --timeline-dir`).
#   STEP=ph  this machine's profile by this tree's profiler ($OUT/q06-profile.json, kept in /tmp/stop28 for the
#            next call), then the prefill-heavy validation bench (rates 8-64), one bench a mode
#   STEP=ls  the long-short validation bench (rates 8-32), one bench a mode; then the arrival probe
#            (docs/gpu_runs/stop28_arrival_probe.py) on this machine
#   STEP=rerun  the cells beyond 15% again with 300 requests a rate, on another machine with its own profile:
#            prefill-heavy colocated at 48 and 64 req/s, long-short disaggregated at 24 and 32
# Carry .gpu-deps. `pdcluster plan --validate` runs on the CPU afterwards.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
KEEP=/tmp/stop28; mkdir -p $KEEP
nvidia-smi --query-gpu=name,serial --format=csv,noheader
N=${N:-150}
COMMON="--model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --workers 1
  --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03"
left() { echo $(( ${1:-585} - SECONDS )); }
bench() {  # MIX MODE flags...: one mode's bench with its timelines; results and a tarball of the timelines to $OUT
  local mix=$1 mode=$2; shift 2
  timeout $(left) python -m scripts.cli bench $COMMON --modes $mode "$@" --out $KEEP/$mix-$mode \
    --serve-args=--timeline-dir=$KEEP/$mix-$mode-timeline 2>&1 | grep -E " ok |rror"
  cp $KEEP/$mix-$mode/results.json $OUT/q06-$mix-$mode.json 2>/dev/null
  tar -czf $OUT/q06-$mix-$mode-timeline.tgz -C $KEEP $mix-$mode-timeline 2>/dev/null
  echo "$mix $mode done at $SECONDS s"
}
[ -f /tmp/q06/config.json ] || python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 \
  --overwrite > /dev/null 2>&1
case ${STEP:-ph} in
  ph)
    timeout 240 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
      --out $OUT/q06-profile.json > $OUT/q06-fits.txt 2> $OUT/q06-progress.txt
    echo "profile rc=$? at $SECONDS s"; grep -E "sustained|worst" $OUT/q06-fits.txt; cp $OUT/q06-profile.json $KEEP/
    for mode in disagg colocated; do
      bench ph $mode --rates 8,16,32,48,64 --input-len 512:2048 --output-len 64:256 --slo-ttft 0.5
    done;;
  ls)
    for mode in disagg colocated; do
      bench ls $mode --workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 \
        --long-output-len 4:16 --long-fraction 0.2 --rates 8,16,24,32 --slo-ttft 1
    done
    timeout $(left) python docs/gpu_runs/stop28_arrival_probe.py /tmp/q06 40 2>&1 | grep -v Warning \
      > $OUT/arrival-probe.txt; tail -9 $OUT/arrival-probe.txt;;
  rerun)
    timeout 240 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
      --out $OUT/q06-profile.json > $OUT/q06-fits.txt 2> $OUT/q06-progress.txt
    echo "profile rc=$? at $SECONDS s"
    N=300 COMMON="${COMMON/--num-requests 150/--num-requests 300}"
    bench ph colocated --rates 48,64 --input-len 512:2048 --output-len 64:256 --slo-ttft 0.5
    bench ls disagg --workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 \
      --long-output-len 4:16 --long-fraction 0.2 --rates 24,32 --slo-ttft 1;;
esac
echo "done at $SECONDS s"; find $OUT -type f | sort
