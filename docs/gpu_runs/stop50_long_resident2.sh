# Stop 50: stop50_long_resident_probe.py under MPS at 70%, alone and beside a second MPS client that holds memory
# and idles (the prefill worker between its steps); then the same pair uncapped and time-sliced. Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/stop48_mps_client.sh
probe() { timeout 150 python docs/gpu_runs/stop50_long_resident_probe.py --model /tmp/q06 --rounds 1 "$@" 2>&1 \
  | grep -E "round|Error|rror:|client"; }
mps_start
echo "== MPS client at 70%, alone"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 probe
echo "== MPS client at 70%, an idle client beside"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 probe --idle-client
mps_quit
echo "== time-sliced, an idle process beside"; probe --idle-client
