#!/usr/bin/env bash
# Stop 48: stop48_mps_share_probe.py time-sliced, then under MPS at several SM shares (the daemon in a private pipe
# directory, quit at the end; the GPU's compute mode is left as it is).
set -u
nvidia-smi --query-gpu=name,serial,compute_mode --format=csv,noheader
probe=docs/gpu_runs/stop48_mps_share_probe.py
echo "== time-sliced"; python $probe
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && sleep 1
for shares in ${SHARES:-100:100 30:70 50:50 70:30}; do
    echo "== MPS, decode:prefill ${shares}"; D_PCT=${shares%:*} P_PCT=${shares#*:} python $probe
done
echo quit | nvidia-cuda-mps-control; sleep 2
