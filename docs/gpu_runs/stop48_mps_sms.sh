# Stop 48: is the decode plan's SM count what breaks the engine at a 70% MPS share (92 SMs seen)? `generate` with
# decode_plan._num_sms patched: 132 under the 70% share, and 92 with no MPS at all.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
patched() {  # NAME SMS: generate with the decode plan told SMS SMs
  timeout 150 python -c "
import sys
import common.engine.attention.decode_plan as plan
plan._num_sms = lambda device: $2
from scripts.cli import main
sys.argv = ['pdcluster', 'generate', '--model', '/tmp/q06', '--device', 'cuda', '--gpu-memory-utilization', '0.3',
            '--prompt', 'hello there', '--max-tokens', '8', '--json']
main()" > $KEEP/gen-$1.log 2>&1
  echo "$1: rc=$? $(grep -c Assertion $KEEP/gen-$1.log) assertions; $(grep -E '^\{' $KEEP/gen-$1.log | cut -c1-100)"
}
patched nomps-92 92
patched nomps-46 46
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 patched s70-132 132
echo quit | nvidia-cuda-mps-control
