# Stop 25 on two GPUs: the GPU tests left after test_tensor_parallel_2_equals_1 hung (the rest of the transfer group),
# then that test alone, with every process's Python stacks dumped if it is still running after TP_WAIT seconds.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
timeout ${REST_LIMIT:-200} python -m pytest -m gpu tests/test_gpu_engine.py::test_late_launch_waits_for_the_step_in_flight \
  tests/test_gpu_warmup.py tests/test_upload.py tests/test_block_copy.py -v -p no:cacheprovider -rfEs > $OUT/rest.txt 2>&1
echo "rest rc=$?"; grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" $OUT/rest.txt | tail -14
timeout $((${TP_WAIT:-100} + 40)) python -m pytest -m gpu tests/test_gpu_engine.py::test_tensor_parallel_2_equals_1 -v -s \
  -p no:cacheprovider --timeout $((${TP_WAIT:-100} + 20)) --timeout-method=thread > $OUT/tp.txt 2>&1 &
sleep ${TP_WAIT:-100}
for p in $(pgrep -f "multiprocessing.spawn"); do echo "ABRT $p"; kill -ABRT $p; done
sleep 5; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
wait; echo "tp done"; tail -5 $OUT/tp.txt
