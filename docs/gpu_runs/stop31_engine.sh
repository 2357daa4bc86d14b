# Stop 31 on two GPUs, after the scheduler and block manager changes (the planner's speed work runs the engine's
# own code): issue 20's throughput command twice, the decode step against the roofline on this tree, then the GPU
# tests that drive the engine's scheduler: the engine against HF and graphs against eager (with prefix caching and
# preemption), and the clusters of every transport against offline generate.
export PYTHONUNBUFFERED=1
N=$PWD
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name,serial --format=csv,noheader
left() { echo $(( ${1:-585} - SECONDS )); }
for i in 1 2; do
  PYTHONPATH=$DEPS:$N timeout 120 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 | grep -E "^pdcluster" \
    | sed "s/^/throughput run $i: /"
done
echo "throughput done at $SECONDS s"
PYTHONPATH=$DEPS:$N timeout 100 python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 \
  | grep -vi warn | tail -6
echo "decode done at $SECONDS s"
PYTHONPATH=$DEPS:$N timeout $(left) python -m pytest -m gpu tests/test_gpu_engine.py tests/test_kvtransfer_gpu.py \
  -k "not tensor_parallel and (engine or graphs or prefix or cluster_output)" -q -p no:cacheprovider -rfEs --durations=3 > $OUT/gpu-engine.txt 2>&1
echo "tests rc=$? at $SECONDS s"; tail -8 $OUT/gpu-engine.txt
