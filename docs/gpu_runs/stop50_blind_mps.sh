# Stop 50: the blind check of stop 49's MPS model (decode `alone` 1.12 measured, `beside` decode 1.0 / prefill 0.35
# fitted) on a fresh machine: its own profile, then 1P:1D under `serve --mps` on both mixes with the workers'
# timelines (to read a decode step's pace beside prompt steps of each size), then, while time is left, the profile
# again as an MPS client at the decode worker's 70% share. At most eight files come back: the small ones are packed
# into extras.tgz at the end. Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
source docs/gpu_runs/stop48_mps_client.sh
profile
mps_bench() {  # MIX: 1P:1D under serve --mps with its timelines
  local mix=$1 flags
  if [ $mix = ph ]; then flags="$PH --rates 8,16,32,48,64"; else flags="$LS --rates 8,16,24,32"; fi
  timeout $(left) python -m scripts.cli bench --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 \
    --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03 \
    --modes disagg $flags --out $KEEP/$mix-mps "--serve-args=--mps --timeline-dir=$KEEP/$mix-mps-timeline" 2>&1 \
    | grep -E " ok |rror|mps"
  cp $KEEP/$mix-mps/results.json $OUT/q06-$mix-mps.json 2>/dev/null
  tar -czf $OUT/q06-$mix-mps-timeline.tgz -C $KEEP $mix-mps-timeline 2>/dev/null
  echo "$mix mps done at $SECONDS s"
}
mps_bench ph
mps_bench ls
if [ $(left) -gt 100 ]; then
  mps_start
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout $(left) python -m scripts.cli profile --model /tmp/q06 --device cuda \
    --model-name Qwen3-0.6B --out $OUT/q06-profile-mps70.json > $KEEP/q06-fits-mps70.txt 2> $KEEP/q06-progress-mps70.txt
  echo "capped profile rc=$? at $SECONDS s"
  mps_quit
fi
mv $OUT/q06-progress.txt $KEEP/ 2>/dev/null
tar -czf $OUT/extras.tgz -C $KEEP $(cd $KEEP && ls *.txt 2>/dev/null)
ls -la $OUT
