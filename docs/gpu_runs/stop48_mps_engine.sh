# Stop 48: the engine alone as an MPS client at SM shares and with PDL on or off: which setting breaks the decode
# worker's warm-up under --mps. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
python -c "import torch; print('SMs seen:', torch.cuda.get_device_properties(0).multi_processor_count)" 2>&1 | tail -1
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70 python -c \
  "import torch; print('SMs seen at 70%:', torch.cuda.get_device_properties(0).multi_processor_count)" 2>&1 | tail -1
PDCLUSTER_PDL=1 gen s70-pdl
PDCLUSTER_PDL=0 gen s70-nopdl
SHARE=100 PDCLUSTER_PDL=1 gen s100-pdl
PDCLUSTER_PDL=1 gen s70-pdl-eager --enforce-eager
grep -h -m3 -E "Error|error" $KEEP/gen-s70-pdl.log | cut -c1-300
mps_quit
