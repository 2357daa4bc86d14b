# Stop 27 on the two-GPU kind: `pytest -m gpu` over the whole suite on this tree (owed since stop 26: the nccl tests
# on the merged GIL change and Posted reading its link's backend), the transfer tests first, each group's log to $OUT.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
FIRST="tests/test_kvtransfer_gpu.py tests/test_multinode_gpu.py tests/test_gpu_engine.py tests/test_gpu_warmup.py
  tests/test_upload.py tests/test_block_copy.py"
left() { echo $(( ${1:-580} - SECONDS )); }
timeout $(left 330) python -m pytest -m gpu $FIRST -q -p no:cacheprovider -rfEs --durations=5 > $OUT/gpu-transfer.txt 2>&1
echo "transfer group rc=$? at $SECONDS s"; tail -15 $OUT/gpu-transfer.txt
timeout $(left) python -m pytest -m gpu tests $(for f in $FIRST; do echo --ignore=$f; done) -q -p no:cacheprovider \
  -rfEs --durations=5 > $OUT/gpu-rest.txt 2>&1
echo "the rest rc=$? at $SECONDS s"; tail -15 $OUT/gpu-rest.txt
