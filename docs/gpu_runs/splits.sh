# Issues 22 and 19 (and 21's validation): Qwen3-8B at equal hardware on all of a machine's GPUS GPUs, one a worker:
# every prefill:decode split, the per-request policy, and GPUS colocated replicas, each its own `pdcluster bench` run
# under $OUT/$MIX/<layout>/, one cluster at a time; then the table (splits_table.py) and the planner's predictions
# beside each run (`pdcluster plan --validate`, with the profile measured first, STEP=profile). Written so that a
# call only measures; a call takes what fits its 10 minutes, and the next goes on with LAYOUTS.
#   STEP=profile  this machine's Qwen3-8B profile ($OUT/profile.json), then the planner's predictions for every
#                 split of GPUS on both mixes, made before any bench (keep them: they are the prediction)
#   STEP=bench    MIX=ls (long-short), ph (prefill-heavy; TTFT SLO 0.5 s) or cc (the bursty chat/coding mix: Azure's code and conversation traces,
#                 carried under .traces/, docs/benchmarks.md "Workloads"); LAYOUTS: a list of 1P3D, 2P2D, 1P1D,
#                 ..., 2P2D-auto (the per-request policy), colo (GPUS replicas); default: all of them
#   STEP=place    prefix-aware against least-loaded placement, two workers a GPU, PREFILL_GPUS (GPUS/2) of them
#                 prefill, on the shared-prefix workload whose prefixes fit the prefill caches together, not one
#   STEP=aiperf   issue 18: aiperf (HTTP) beside `pdcluster bench` (ZMQ) on the same load, the even split and the
#                 colocated replicas (needs .whl/aiperf, docs/gpu_runs/install_aiperf.sh)
#   STEP=table    the table and the validations of what is under $OUT (PROFILE: the profile's path)
# DEVICE=cpu CONFIG=tiny-qwen3 runs the same steps on a CPU (a dry run of this script; GPUS then counts workers),
# with WORKLOAD_ARGS for lengths a tiny model takes and RATES, N for a CPU's pace.
# TIMELINE=1: each bench serves with `--timeline-dir $OUT/$MIX/<layout>-timeline` (split by `python -m scripts.timeline`).
# A call brings back at most 8 files: STEP=bench keeps only each layout's results.json (and timelines), unless FULL=1.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps 2>/dev/null || true):$PWD PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}; CONFIG=${CONFIG:-qwen3-8b}; MODEL=/tmp/$CONFIG; MIX=${MIX:-ls}; N=${N:-200}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
PROFILE=${PROFILE:-$OUT/profile.json}
RATES_GIVEN=${RATES:-}  # else each mix's own, scaled with the GPUs
[ -f $MODEL/config.json ] || python -m scripts.cli prepare-model random --config $CONFIG --out $MODEL --overwrite > /dev/null
nvidia-smi --query-gpu=name,serial --format=csv,noheader 2>/dev/null; echo "GPUS=$GPUS MIX=$MIX"
mix() {  # MIX -> WORKLOAD, RATES (whole-cluster requests/s, scaled with the GPUs)
  SLO_TTFT=${SLO_TTFT_GIVEN:-1}
  case $1 in
    ls) WORKLOAD="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192
          --long-output-len 4:16 --long-fraction 0.2"; RATES=${RATES_GIVEN:-$((2*GPUS)),$((4*GPUS)),$((8*GPUS)),$((12*GPUS))};;
    ph) WORKLOAD="--input-len 512:2048 --output-len 64:256"; SLO_TTFT=${SLO_TTFT_GIVEN:-0.5}  # prefill-heavy
        RATES=${RATES_GIVEN:-$((4*GPUS)),$((8*GPUS)),$((12*GPUS)),$((16*GPUS))};;
    cc) WORKLOAD="--workload trace --trace .traces/AzureLLMInferenceTrace_code.csv,.traces/AzureLLMInferenceTrace_conv.csv
          --trace-start 180"; RATES=${RATES_GIVEN:-$((2*GPUS)),$((4*GPUS)),$((6*GPUS)),$((8*GPUS))};;
    *) echo "MIX: ls, ph or cc, got $1"; exit 2;;
  esac
  WORKLOAD=${WORKLOAD_ARGS:-$WORKLOAD}
  SLO="--slo-ttft $SLO_TTFT --slo-tpot ${SLO_TPOT:-0.03}"
}
SLO_TTFT_GIVEN=${SLO_TTFT:-}
[ "${STEP:-bench}" = profile ] || mix $MIX
layouts() {  # every split of GPUS, the per-request policy on the even split, the colocated replicas
  for p in $(seq 1 $((GPUS-1))); do echo ${p}P$((GPUS-p))D; done; echo $((GPUS/2))P$((GPUS-GPUS/2))D-auto; echo colo
}
bench() {  # LAYOUT -> one bench run
  local l=$1 flags
  case $l in
    colo) flags="--modes colocated --workers $GPUS";;
    *P*D*) p=${l%%P*}; d=${l#*P}; d=${d%%D*}; mode=disagg; [ "${l#*-}" = auto ] && mode=disagg:auto
           flags="--modes $mode --prefill-workers $p --decode-workers $d";;
  esac
  echo "## $MIX $l"
  [ "${TIMELINE:-0}" = 1 ] && flags="$flags --serve-args=--timeline-dir=$OUT/$MIX/$l-timeline"  # 2 folders down: it comes back
  timeout ${LIMIT:-560} python -m scripts.cli bench --model $MODEL --device $DEVICE $flags $WORKLOAD --rates $RATES \
    --num-requests $N $SLO --gpus-per-worker 1 ${EXTRA:-} --out $OUT/$MIX/$l 2>&1 | grep -E " ok |rror"
  [ "${FULL:-0}" = 1 ] || find $OUT/$MIX/$l -type f ! -name "*.json" -delete
}
case ${STEP:-bench} in
  profile)
    timeout 420 python -m scripts.cli profile --model $MODEL --device $DEVICE --model-name $CONFIG ${QUICK:+--quick} --out $PROFILE \
      > /dev/null 2> $OUT/profile-progress.txt; tail -1 $OUT/profile-progress.txt; rm -f $OUT/profile-progress.txt
    for m in ls ph cc; do  # the predictions, before any bench ran on this machine
      mix $m
      python -m scripts.cli plan --profile $PROFILE --gpus $GPUS --num-requests $N $SLO --rates $RATES $WORKLOAD \
        --out $OUT/plan-$m | tail -$((6 * GPUS + 4)); done;;
  bench) for l in ${LAYOUTS:-$(layouts)}; do bench $l; done;;
  place)  # two workers a GPU: PREFILL_GPUS GPUs of prefill workers, the others decode
    pg=${PREFILL_GPUS:-$((GPUS/2))}
    timeout ${LIMIT:-560} python -m scripts.cli bench --model $MODEL --device $DEVICE --modes disagg:prefix,disagg:load \
      --prefill-workers $((2*pg)) --decode-workers $((2*(GPUS-pg))) --gpus-per-worker 0.5 --workload shared-prefix \
      --prefix-len 2048 --prefix-cache-tokens 65536 --input-len 64:256 --output-len 64:256 --rates $RATES \
      --num-requests $N --arrivals gamma --burstiness 2 $SLO --serve-args='--num-kv-blocks 4096' \
      --out $OUT/place 2>&1 | grep -E " ok |rror|hit rate";;
  aiperf)  # issue 18: NVIDIA's aiperf (HTTP) and `pdcluster bench` (ZMQ) sending the same Poisson load at the mix's
           # rates to the even split and to the colocated replicas; needs .whl/aiperf carried (install_aiperf.sh)
    bash docs/gpu_runs/install_aiperf.sh 2>&1 | tail -2
    common="--model $MODEL --device $DEVICE --rates $RATES --with-bench --requests $N --warmup 8 --isl 1024 --osl 256"
    timeout 280 python -m scripts.bench_aiperf $common --modes disagg --prefill-workers $((GPUS/2)) \
      --decode-workers $((GPUS-GPUS/2)) --gpus-per-worker 1 --out $OUT/aiperf 2>&1 | grep -v -i warn | tail -8
    timeout 280 python -m scripts.bench_aiperf $common --modes colocated --workers $GPUS --gpus-per-worker 1 \
      --out $OUT/aiperf 2>&1 | grep -v -i warn | tail -8;;
  table)
    python docs/gpu_runs/splits_table.py $OUT/$MIX
    for r in $OUT/$MIX/*/results.json; do
      [ -f $PROFILE ] && python -m scripts.cli plan --validate $r --profile $PROFILE | tail -n +3; done;;
esac
