export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps) PYTHONUNBUFFERED=1
N=$PWD
echo "== GPU tests (new tree)"
PYTHONPATH=$PYTHONPATH:$N timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_warmup.py tests/test_gpu_engine.py tests/test_flash_prefill.py tests/test_cuda_graph_shapes.py 2>&1 | tail -4
echo "== throughput, new / old / new (256 seqs, Qwen3-0.6B, graphs)"
for t in new old new; do
  if [ $t = new ]; then d=$N; else d=$N/.ab/base; fi
  (cd $d && PYTHONPATH=$PYTHONPATH:$d timeout 100 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 | grep -E "^pdcluster" | head -2 | sed "s/^/$t: /")
done
