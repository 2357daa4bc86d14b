# Sourced by the one-GPU validation scripts (stop27_one_gpu.sh, stop28_one_gpu.sh, stop29_one_gpu.sh): Qwen3-0.6B
# on one GPU, 1P:1D at half the GPU each against one colocated replica, each mode served with its timelines
# (`serve --timeline-dir`), its results and a tarball of its timelines to $OUT. The sourcing script sets KEEP (a
# folder kept between calls on a warm machine) and may set N (requests a rate, default 150). Carry .gpu-deps.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
mkdir -p $KEEP
nvidia-smi --query-gpu=name,serial --format=csv,noheader
N=${N:-150}
left() { echo $(( ${1:-585} - SECONDS )); }
bench() {  # MIX MODE flags...: one mode's bench with its timelines; TAG names a variant (its files MIX-MODE-TAG),
  # SERVE gives `serve` more flags (e.g. SERVE=--mps)
  local mix=$1 mode=$2 name=$1-$2${TAG:+-$TAG}; shift 2
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
    --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
    --modes $mode "$@" --out $KEEP/$name "--serve-args=${SERVE:-} --timeline-dir=$KEEP/$name-timeline" 2>&1 \
    | grep -E " ok |rror"
  cp $KEEP/$name/results.json $OUT/q06-$name.json 2>/dev/null
  tar -czf $OUT/q06-$name-timeline.tgz -C $KEEP $name-timeline 2>/dev/null
  echo "$name done at $SECONDS s"
}
# the two mixes' flags, as `bench ph MODE $PH --rates ...`
PH="--input-len 512:2048 --output-len 64:256 --slo-ttft 0.5"
LS="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16
  --long-fraction 0.2 --slo-ttft 1"
profile() {  # this machine's profile by this tree's profiler, kept in $KEEP for the next call
  timeout 240 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
    --out $OUT/q06-profile.json > $OUT/q06-fits.txt 2> $OUT/q06-progress.txt
  echo "profile rc=$? at $SECONDS s"; grep -E "sustained|worst" $OUT/q06-fits.txt; cp $OUT/q06-profile.json $KEEP/
}
[ -f /tmp/q06/config.json ] || python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 \
  --overwrite > /dev/null 2>&1
