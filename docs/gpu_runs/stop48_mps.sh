#!/usr/bin/env bash
# Stop 48: two processes on one GPU, time-sliced against CUDA MPS (stop 20's probe under each; the MPS daemon is
# started in a private pipe directory and quit at the end: the GPU's compute mode is left as it is).
set -u
nvidia-smi --query-gpu=name,serial,compute_mode,driver_version --format=csv,noheader
command -v nvidia-cuda-mps-control || { echo "no nvidia-cuda-mps-control"; exit 0; }
echo "== time-sliced"; python docs/gpu_runs/stop20_timeslice_probe.py
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
nvidia-cuda-mps-control -d && sleep 1
echo "== MPS"; python docs/gpu_runs/stop20_timeslice_probe.py
echo get_server_list | nvidia-cuda-mps-control
echo quit | nvidia-cuda-mps-control; sleep 2
tail -5 "$CUDA_MPS_LOG_DIRECTORY"/control.log
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
echo "== time-sliced again"; python docs/gpu_runs/stop20_timeslice_probe.py
