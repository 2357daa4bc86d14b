# Prompt graphs in a served cluster: the warm-up test (no compiling after ready), then the same bench on this tree
# ("new") and on f53e84b ("old", .ab/base: git archive of it), in one call. Qwen3-0.6B on one H100, disaggregated
# (1P + 1D, half a GPU each) and colocated (two replicas, half a GPU each).
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps) PYTHONUNBUFFERED=1
N=$PWD
PYTHONPATH=$PYTHONPATH:$N timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_warmup.py 2>&1 | tail -1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
for t in new old; do
  if [ $t = new ]; then d=$N; else d=$N/.ab/base; fi
  (cd $d && PYTHONPATH=$PYTHONPATH:$d timeout 200 python -m scripts.cli bench --model /tmp/q06 --device cuda \
    --modes disagg,colocated --prefill-workers 1 --decode-workers 1 --workers 2 --gpus-per-worker 0.5 \
    --rates 8,16,32 --num-requests 120 --input-len 100:1024 --output-len 100:512 --slo-ttft 0.5 --slo-tpot 0.05 \
    --out /tmp/ab-$t 2>&1 | grep -E " ok " | sed "s/^/$t: /")
done
