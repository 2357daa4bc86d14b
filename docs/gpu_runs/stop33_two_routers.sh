# Stop 33 (issue 21): the planner's model of several routers, measured as a deployment. Qwen3-8B (random weights),
# prefill-heavy, Poisson arrivals, one GPU an engine:
#   STEP=two  two routers side by side, each in front of its own colocated engine on its own GPU, the clients split
#             at random: two benches at once, each sending its router's share (a Poisson stream at half the rate, its
#             own seed), results under $OUT/router0 and $OUT/router1
#   STEP=one  one router in front of both engines, the whole rate ($OUT/one)
# Then on the CPU: python docs/gpu_runs/stop33_merge.py $OUT (the two routers' requests taken together) beside
# `pdcluster plan --routers 2` and `--routers 1`, and `plan --validate` of each run.
# DEVICE=cpu CONFIG=tiny-qwen3 WORKLOAD_ARGS=... RATES=... N=... is a dry run on a CPU.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps 2>/dev/null || true):$PWD PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}; CONFIG=${CONFIG:-qwen3-8b}; MODEL=/tmp/$CONFIG; N=${N:-600}; RATES=${RATES:-24,32,40}
WORKLOAD=${WORKLOAD_ARGS:---input-len 512:2048 --output-len 64:256}
SLO="--slo-ttft ${SLO_TTFT:-0.5} --slo-tpot ${SLO_TPOT:-0.05}"
[ -f $MODEL/config.json ] || python -m scripts.cli prepare-model random --config $CONFIG --out $MODEL --overwrite > /dev/null
nvidia-smi --query-gpu=name,serial --format=csv,noheader 2>/dev/null
half=$(python -c "print(','.join(f'{float(r) / 2:g}' for r in '$RATES'.split(',')))")
bench() {  # OUT_DIR VISIBLE_GPUS WORKERS RATES REQUESTS SEED
  local gpus=""
  [ $DEVICE = cpu ] || gpus="--gpus-per-worker 1"
  CUDA_VISIBLE_DEVICES=$2 timeout ${LIMIT:-290} python -m scripts.cli bench --model $MODEL --device $DEVICE \
    --modes colocated --workers $3 $WORKLOAD --rates $4 --num-requests $5 --seed $6 $SLO $gpus --out $1 2>&1 \
    | grep -E " ok |rror" | sed "s|^|$(basename $1): |"
  find $1 -type f ! -name results.json -delete
}
case ${STEP:-two} in
  two) bench $OUT/router0 0 1 $half $((N / 2)) 1 & bench $OUT/router1 1 1 $half $((N / 2)) 2; wait;;
  one) bench $OUT/one 0,1 2 $RATES $N 0;;
  *) echo "STEP: two or one, got $STEP"; exit 2;;
esac
echo "done at $SECONDS s"
