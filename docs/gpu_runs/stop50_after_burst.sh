# Stop 50: stop50_after_burst_probe.py: decode steps (an MPS client at 70%) beside a process running 35 ms bursts of
# matmuls every 150 ms (uncapped, then at 30%), then both time-sliced; SM clock and power sampled by nvidia-smi
# meanwhile. Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/stop48_mps_client.sh
P=docs/gpu_runs/stop50_after_burst_probe.py
share() { if [ -n "$1" ]; then echo "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$1"; fi; }
pair() {  # NAME BURST_SHARE DECODE_SHARE (empty: no MPS share set)
  local name=$1
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 10 > $KEEP/smi-$name.txt 2>&1 &
  local smi=$!
  env $(share $2) timeout 120 python $P --role burst --seconds 100 --out $KEEP/b-$name.txt &
  local bp=$!
  env $(share $3) timeout 90 python $P --role decode --seconds 6 --out $KEEP/d-$name.json 2>&1 | grep -iE "rror" | head -3
  kill $bp $smi; wait $bp 2>/dev/null
  echo "== $name: $(wc -l < $KEEP/b-$name.txt) bursts"
  python $P --role report --bursts $KEEP/b-$name.txt --out $KEEP/d-$name.json
  echo "SM clock (MHz) samples, most common:"; awk -F', ' '{print $2}' $KEEP/smi-$name.txt | sort | uniq -c | sort -rn | head -4
  awk -F', ' '{gsub(/ W/,"",$3); if ($3+0 > m) m = $3+0} END {print "max power " m " W"}' $KEEP/smi-$name.txt
}
mps_start
pair mps-burst100 100 70
pair mps-burst30 30 70
mps_quit
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
pair sliced "" ""
