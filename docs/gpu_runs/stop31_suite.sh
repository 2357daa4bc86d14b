# Stop 31 on two GPUs: issue 20's first 20 requests against requests 101-120 on a cluster whose pair talks over nccl
# (cold Triton cache, then warm), colocated on two GPUs beside it; then `pytest -m gpu` over the transfer group
# (kvtransfer's cuda_ipc, nccl and auto clusters, multinode, engine, warm-up) on this tree.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
left() { echo $(( ${1:-585} - SECONDS )); }
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc31
timeout 110 python docs/gpu_runs/stop31_first_window.py /tmp/q06 disagg-cold 5711 disagg 1 1
timeout 90 python docs/gpu_runs/stop31_first_window.py /tmp/q06 disagg-warm 5712 disagg 1 1
timeout 90 python docs/gpu_runs/stop31_first_window.py /tmp/q06 colocated-warm 5713 colocated 2
echo "windows done at $SECONDS s"
unset TRITON_CACHE_DIR
FIRST="tests/test_kvtransfer_gpu.py tests/test_multinode_gpu.py tests/test_gpu_engine.py tests/test_gpu_warmup.py"
timeout $(left) python -m pytest -m gpu $FIRST -q -p no:cacheprovider -rfEs --durations=5 > $OUT/gpu-transfer.txt 2>&1
echo "transfer group rc=$? at $SECONDS s"; tail -15 $OUT/gpu-transfer.txt
