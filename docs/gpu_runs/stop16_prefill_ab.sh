export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps) PYTHONUNBUFFERED=1
N=$PWD
for r in 1 2; do
  (cd $N && PYTHONPATH=$PYTHONPATH:$N timeout 90 python .ab/prefill_time.py new 2>&1 | grep prefill)
  (cd $N/.ab/base && PYTHONPATH=$PYTHONPATH:$N/.ab/base timeout 90 python prefill_time.py old 2>&1 | grep prefill)
done
(cd $N && PYTHONPATH=$PYTHONPATH:$N timeout 90 python .ab/prefill_time.py new-8b qwen3-8b 2>&1 | grep prefill)
(cd $N/.ab/base && PYTHONPATH=$PYTHONPATH:$N/.ab/base timeout 90 python prefill_time.py old-8b qwen3-8b 2>&1 | grep prefill)
cd $N && PYTHONPATH=$PYTHONPATH:$N timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_flash_prefill.py tests/test_gpu_engine.py -x 2>&1 | tail -2
