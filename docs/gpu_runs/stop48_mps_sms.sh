# Stop 48: is the decode plan's SM count what breaks the engine at a 70% MPS share (92 SMs seen)? `generate` with
# decode_plan._num_sms patched: 92 and 46 with no MPS at all, 132 under the 70% share. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
told() { PATCH="import common.engine.attention.decode_plan as plan; plan._num_sms = lambda device: $2" gen "$1"; }
SHARE=100 told nomps-92 92
SHARE=100 told nomps-46 46
mps_start
told s70-132 132
mps_quit
