# Stop 57 (issue 20): `serve` start-up, this tree ("new": the router's tokenizer loads while Ray starts) against
# a30b76a's (`.ab/old`: the tokenizer loaded first), colocated on one H200: one start to fill the Triton cache, then
# the two alternated, each start's own log line ("ready in ..."). Carry .gpu-deps and .ab.
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name,serial --format=csv,noheader
export PYTHONPATH=$DEPS:$PWD
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve57ab
start() {  # TREE LABEL
  local log=/tmp/serve-$2.log t0=$(date +%s.%N)
  (cd $1 && PYTHONPATH=$DEPS:$PWD timeout 80 python -m scripts.cli serve --model /tmp/q06 --device cuda \
    --gpus-per-worker 0.5 --mode colocated --workers 2 --bind tcp://127.0.0.1:$((20000 + RANDOM % 20000)) > $log 2>&1) &
  local pid=$!
  while ! grep -q "serving on" $log; do sleep 0.1; kill -0 $pid 2>/dev/null || break; done
  echo "$2: $(python -c "print(round($(date +%s.%N) - $t0, 1))") s; $(grep -o 'ready in.*' $log | tail -1)"
  sleep 2; pkill -INT -f "scripts.cli serve"; wait $pid
}
start $PWD warm-up
for i in 1 2 3; do start $PWD/.ab/old old-$i; start $PWD new-$i; done
