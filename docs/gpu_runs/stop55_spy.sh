# Stop 55 (issue 21): where a colocated Qwen3-0.6B replica's host time goes at prefill-heavy 64 req/s (past
# capacity), the load at which its GPU idles 2-4% of its busy time: py-spy (nonblocking, 1 kHz) on the worker for
# SPY seconds (default 6) from the end of the bench's unloaded point, raw stacks to $OUT/spy-*.txt. ROUNDS (default
# 2) benches. Carry .gpu-deps.
KEEP=/tmp/stop55spy
N=${N:-200}
source docs/gpu_runs/one_gpu_validation.sh
SPYBIN=/tmp/site/bin/py-spy  # where .gpu-deps/unpack puts the wheel's binary
for round in $(seq ${ROUNDS:-2}); do
  log=$KEEP/bench$round.log; : > $log
  ( until grep -q "unloaded" $log 2>/dev/null; do sleep 0.05; done
    pid=$(pgrep -f "ray::WorkerActor" | head -1)
    echo "spy on $pid: $(tr '\0' ' ' < /proc/$pid/cmdline | cut -c1-60)"
    $SPYBIN record --nonblocking -r 1000 -f raw -d ${SPY:-6} -p $pid -o $OUT/spy-$round.txt > /dev/null 2>&1
    echo "spy rc=$?" ) &
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --workers 1 \
    --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 --modes colocated $PH --rates 64 \
    --out $KEEP/r$round "--serve-args=--timeline-dir=$KEEP/r$round-timeline" > $log 2>&1
  wait
  grep -E " ok |rror" $log
  cp $KEEP/r$round/results.json $OUT/r$round.json
  python docs/gpu_runs/spy_summary.py $OUT/spy-$round.txt "" 25
  echo "round $round done at $SECONDS s"
done
