# Stop 19 on one H100: the decode plan that cuts units of a wave and a half (this tree, "new") against 5ba97de
# ("old", .ab/stop18): the GPU suites of the attention kernels and graphs on the new tree, then the engine's
# decode step over equal and spread contexts (stop19_decode_spread.py), old / new / old / new, then a fresh
# profile of the new tree (decode points over spread contexts) for the planner.
set -u
export PYTHONUNBUFFERED=1
N=$PWD
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=$DEPS:$N python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
PYTHONPATH=$DEPS:$N timeout 240 python -m pytest -q -m gpu tests/test_triton_ops.py tests/test_attention_backends.py \
  tests/test_graph_replay_triton.py tests/test_cuda_graph_shapes.py 2>&1 | tail -2
for t in old new old new; do
  if [ $t = new ]; then d=$N; else d=$N/.ab/stop18; fi
  (cd $d && PYTHONPATH=$DEPS:$d timeout 100 python $N/docs/gpu_runs/stop19_decode_spread.py /tmp/q06 2>&1 \
    | grep "^batch" | sed "s/^/$t: /")
done
PYTHONPATH=$DEPS:$N timeout 150 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
  --out $OUT/h100-q06.json > $OUT/full.txt 2> $OUT/progress.txt; tail -1 $OUT/progress.txt
