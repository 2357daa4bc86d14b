# Stop 50: stop50_long_one_token.sh at 8 req/s with the GPU's SM clock and power sampled every 5 ms by nvidia-smi,
# and the wall and monotonic clocks printed side by side, to line the samples up with the workers' timelines. Carry
# .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
LS1=${LS/--long-output-len 4:16/--long-output-len 1:1}
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader -lms 5 \
  > $KEEP/smi.txt 2>&1 &
smi=$!
python -c "import time; print('clocks', time.time(), time.monotonic())" > $OUT/clocks.txt
timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
  --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
  --modes disagg $LS1 --rates 8 --out $KEEP/ls1c "--serve-args=--mps --timeline-dir=$KEEP/ls1c-timeline" 2>&1 \
  | grep -E " ok |rror"
python -c "import time; print('clocks', time.time(), time.monotonic())" >> $OUT/clocks.txt
kill $smi
cp $KEEP/ls1c/results.json $OUT/q06-ls1c-mps.json
gzip -c $KEEP/smi.txt > $OUT/smi.txt.gz
tar -czf $OUT/q06-ls1c-mps-timeline.tgz -C $KEEP ls1c-timeline
awk -F', ' '{print $2}' $KEEP/smi.txt | sort | uniq -c | sort -rn | head -5; wc -l $KEEP/smi.txt
