# Stop 25 on two GPUs: test_tensor_parallel_2_equals_1 with the fix (forward_fresh sent to every rank), then the
# kernel GPU tests owed on stop 24's final tree; each writes its log under $OUT, so a cut run still reports.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
timeout 150 python -m pytest -m gpu tests/test_gpu_engine.py::test_tensor_parallel_2_equals_1 -v -s -p no:cacheprovider \
  > $OUT/tp.txt 2>&1; echo "tp rc=$?"; grep -E "agree|PASSED|FAILED|passed|failed" $OUT/tp.txt | tail -4
timeout ${KERNELS_LIMIT:-200} python -m pytest -m gpu tests/test_triton_ops.py tests/test_fused.py tests/test_flash_prefill.py \
  -q -p no:cacheprovider -rfEs > $OUT/kernels.txt 2>&1; echo "kernels rc=$?"; tail -4 $OUT/kernels.txt
