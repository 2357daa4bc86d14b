# Stop 54, call 1 (fresh machine; carry .gpu-deps): the machine's profile uncapped, then as an MPS client at 50% of the
# SMs (`serve --mps`'s decode cap since stop 53), both kept in $KEEP for the next call on the warm machine; then the
# GPU tests owed on stop 53's final tree.
source docs/gpu_runs/stop48_mps_client.sh
KEEP=/tmp/stop54; mkdir -p $KEEP
profile
mps_start
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout $(left 400) python -m scripts.cli profile --model /tmp/q06 \
  --device cuda --model-name Qwen3-0.6B --out $OUT/q06-profile-mps50.json > $OUT/q06-fits-mps50.txt 2>&1
echo "capped profile rc=$? at $SECONDS s"
mps_quit; sleep 1
cp $OUT/q06-profile-mps50.json $KEEP/ 2>/dev/null
timeout $(left 590) python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py tests/test_gpu_warmup.py \
  tests/test_head_sampler.py tests/test_mps_gpu.py 2>&1 | tail -15
echo "tests done at $SECONDS s"
