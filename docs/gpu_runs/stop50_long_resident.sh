# Stop 50: stop50_long_resident_probe.py on Qwen3-0.6B (random weights), uncapped, then as an MPS client at the
# decode worker's 70% share, then uncapped again. Carry .gpu-deps.
KEEP=/tmp/stop50
source docs/gpu_runs/stop48_mps_client.sh
probe() { timeout 200 python docs/gpu_runs/stop50_long_resident_probe.py --model /tmp/q06 "$@" 2>&1 | grep -E "round|Error|rror:"; }
echo "== uncapped"; probe
mps_start
echo "== MPS client at 70%"; CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 probe
mps_quit
echo "== uncapped again"; probe --rounds 1
