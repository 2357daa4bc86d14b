set -u
export PYTHONUNBUFFERED=1
echo "== migration on the GPU: 2P+2D on one GPU, a decode worker killed under 32 streaming clients"
PDCLUSTER_TEST_DEVICE=cuda PDCLUSTER_TEST_SERVE_ARGS="--gpus-per-worker 0.25" timeout 200 python -m pytest -q -p no:cacheprovider tests/test_reliability.py -k "streaming_clients" 2>&1 | tail -4
echo "== placement bench"
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
timeout 360 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg:prefix,disagg:load \
  --prefill-workers 3 --decode-workers 1 --gpus-per-worker 0.25 --workload shared-prefix --prefix-len 2048 \
  --prefix-cache-tokens 32768 --input-len 64:256 --output-len 32:64 --rates 4,8,16 --num-requests 150 \
  --arrivals gamma --burstiness 2 --serve-args='--num-kv-blocks 2048' --out $OUT/placement 2>&1 | grep -vi "warn" | tail -30
