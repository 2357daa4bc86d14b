# Stop 48: `generate` at a 70% MPS share with one setting changed (A/AF, B/BF: names and flags; by default without
# overlapped scheduling, then without late launch): which piece of the decode graphs fails under the cap. Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
gen() {  # NAME flags...
  local name=$1; shift
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout 100 python -m scripts.cli generate --model /tmp/q06 --device cuda \
    --gpu-memory-utilization 0.3 --prompt "hello there" --max-tokens 8 --json "$@" > $KEEP/gen-$name.log 2>&1
  echo "$name: rc=$? $(grep -c Assertion $KEEP/gen-$name.log) assertions; $(grep -E '^\{' $KEEP/gen-$name.log | cut -c1-90)"
}
gen ${A:-no-overlap} ${AF:---no-overlap-scheduling}
gen ${B:-no-late-launch} ${BF:---no-late-launch}
echo quit | nvidia-cuda-mps-control
