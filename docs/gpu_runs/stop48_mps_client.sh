# Sourced by stop 48's MPS scripts: Qwen3-0.6B (random weights, one_gpu_validation.sh), an MPS control daemon of
# the call's own (`mps_start`, `mps_quit`; the GPU's compute mode is left as it is), and `gen NAME flags...`:
# `pdcluster generate` of one prompt, its warm-up included, as an MPS client at SHARE% of the SMs (default 70), after
# the Python of PATCH if given; prints its exit status, the device-side asserts it logged and its tokens.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d; sleep 1
}
mps_quit() { echo quit | nvidia-cuda-mps-control; }
gen() {
  local name=$1; shift
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${SHARE:-70} timeout ${GEN_LIMIT:-120} python -c "
import sys
${PATCH:-}
from scripts.cli import main
sys.exit(main(['generate', '--model', '/tmp/q06', '--device', 'cuda', '--gpu-memory-utilization', '0.3',
               '--prompt', 'hello there', '--max-tokens', '8', '--json'] + sys.argv[1:]))" "$@" > $KEEP/gen-$name.log 2>&1
  echo "$name: rc=$? $(grep -c Assertion $KEEP/gen-$name.log) assertions; $(grep -E '^\{' $KEEP/gen-$name.log | cut -c1-90)"
}
