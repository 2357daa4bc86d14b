# Stop 48: the engine alone as an MPS client (Qwen3-0.6B random weights, `pdcluster generate`, its warm-up
# included) at SM shares and with PDL on or off: which setting breaks the decode worker's warm-up under --mps.
KEEP=/tmp/stop48
source docs/gpu_runs/one_gpu_validation.sh
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d; sleep 1
one() {  # NAME SHARE PDL flags...
  local name=$1 share=$2 pdl=$3; shift 3
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share PDCLUSTER_PDL=$pdl timeout 150 python -m scripts.cli generate \
    --model /tmp/q06 --device cuda --gpu-memory-utilization 0.3 --prompt "hello there" --max-tokens 8 --json "$@" \
    > $KEEP/gen-$name.log 2>&1
  echo "$name: rc=$? $(grep -c Assertion $KEEP/gen-$name.log) assertions; $(grep -E '^\{' $KEEP/gen-$name.log | cut -c1-120)"
}
python -c "import torch; print('SMs seen at 70%:', torch.cuda.get_device_properties(0).multi_processor_count)" \
  2>&1 | tail -1
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 python -c "import torch; print('SMs seen at 70%:', torch.cuda.get_device_properties(0).multi_processor_count)" 2>&1 | tail -1
one s70-pdl 70 1
one s70-nopdl 70 0
one s100-pdl 100 1
one s70-pdl-eager 70 1 --enforce-eager
grep -h -m3 -E "Error|error" $KEEP/gen-s70-pdl.log | cut -c1-300
echo quit | nvidia-cuda-mps-control
