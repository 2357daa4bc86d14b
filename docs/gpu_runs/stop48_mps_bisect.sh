# Stop 48: which Triton path of the decode graphs fails under a 70% MPS share: `generate` with one of the layers'
# Triton modules turned off (fusion.py then serves the torch path), one at a time. Carry .gpu-deps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
for off in ${OFF:-head_sampler splitk fused gemv}; do
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 timeout 90 python -c "
import sys
from common.engine.layers import fusion
fusion._loaded['$off'] = None
from scripts.cli import main
sys.argv = ['pdcluster', 'generate', '--model', '/tmp/q06', '--device', 'cuda', '--gpu-memory-utilization', '0.3',
            '--prompt', 'hello there', '--max-tokens', '8', '--json']
main()" > $KEEP/gen-off-$off.log 2>&1
  echo "without $off: rc=$? $(grep -c Assertion $KEEP/gen-off-$off.log) assertions; $(grep -E '^\{' $KEEP/gen-off-$off.log | cut -c1-80)"
done
echo quit | nvidia-cuda-mps-control
