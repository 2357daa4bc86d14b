# Stop 25 on two GPUs: the GIL probe of a real nccl receive (stop24_gil_gpu_probe.py at 1f48a66; now stop25_gil_probe.py cuda), then the GPU tests owed on
# stop 24's final tree. GROUP=transfer (kvtransfer, clusters, engine, warm-up, upload, block copy, multinode) or
# GROUP=kernels (Triton attention, fused ops, flash prefill).
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
python -c "import torch; print('peer access 0<->1:', torch.cuda.can_device_access_peer(0, 1), torch.cuda.can_device_access_peer(1, 0))"
case ${GROUP:-transfer} in
  transfer)
    [ "${GIL:-1}" = 1 ] && (cd docs/gpu_runs && timeout 150 python stop25_gil_probe.py cuda 2>&1 | grep -E "resolved|rror|Trace" | tail -12)
    FILES="tests/test_kvtransfer_gpu.py tests/test_multinode_gpu.py tests/test_gpu_engine.py tests/test_gpu_warmup.py
      tests/test_upload.py tests/test_block_copy.py";;
  kernels) FILES="tests/test_triton_ops.py tests/test_fused.py tests/test_flash_prefill.py";;
esac
timeout ${LIMIT:-420} python -m pytest -m gpu $FILES -q -p no:cacheprovider -rfEs --durations=5 2>&1 | tail -40
