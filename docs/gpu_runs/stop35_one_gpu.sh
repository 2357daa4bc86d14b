# Stop 35 on one GPU (nvidia-h200): Qwen3-0.6B long-short, 1P:1D at half the GPU each, at 24 and 32 req/s with 300
# requests a rate (stop 29's "moved" cells), served by the tree before the client change (.ab/base: `git archive
# 7f41d12 | tar -x -C .ab/base`) and by this one, on one machine; each run's results.json to $OUT/<name>.json for
# `pdcluster plan --validate` on the CPU. Carry .gpu-deps and .ab.
set -u
export PYTHONUNBUFFERED=1
ln -sfn $PWD/.gpu-deps .ab/base/.gpu-deps
nvidia-smi --query-gpu=name,serial --format=csv,noheader
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
[ -f /tmp/q06/config.json ] || python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 \
  --overwrite > /dev/null 2>&1
for tree in ${ORDER:-.ab/base .}; do
  name=$([ $tree = . ] && echo client || echo base)
  (cd $tree && export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD && timeout ${LIMIT:-150} python -m scripts.cli bench \
    --model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 --gpus-per-worker 0.5 --num-requests 300 \
    --slo-tpot 0.03 --modes disagg --workload long-short --input-len 128:512 --output-len 128:512 \
    --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 --slo-ttft 1 --rates 24,32 \
    --out /tmp/s35-$name 2>&1 | grep -E " ok |rror" | sed "s/^/$name: /")
  cp /tmp/s35-$name/results.json $OUT/q06-ls-$name.json
  echo "$name done at $SECONDS s"
done
