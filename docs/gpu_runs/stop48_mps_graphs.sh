# Stop 48: under a 70% MPS share, which CUDA graphs break `generate` (decode graphs off, then prompt graphs off);
# then stop48_mps_share_probe.py with the prefill side capped (its share now set before torch loads CUDA).
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
gen() {  # NAME flags...
  local name=$1; shift
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout 150 python -m scripts.cli generate --model /tmp/q06 --device cuda \
    --gpu-memory-utilization 0.3 --prompt "hello there" --max-tokens 8 --json "$@" > $KEEP/gen-$name.log 2>&1
  echo "$name: rc=$? $(grep -c Assertion $KEEP/gen-$name.log) assertions; $(grep -E '^\{' $KEEP/gen-$name.log | cut -c1-90)"
}
gen s70-no-decode-graphs --cuda-graph-max-bs 0
gen s70-no-prompt-graphs --prefill-graph-max-tokens 0
for shares in 100:70 100:50; do
  echo "== MPS, decode:prefill ${shares}"; D_PCT=${shares%:*} P_PCT=${shares#*:} python docs/gpu_runs/stop48_mps_share_probe.py
done
echo quit | nvidia-cuda-mps-control
