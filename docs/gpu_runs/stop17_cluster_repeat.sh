# The served cluster again: this tree with always / auto / colocated at 16 and 32 req/s (150 requests), then f53e84b
# (.ab/base) at 32 req/s, in one call: is the TTFT p99 at 32 req/s of stop17_cluster_ab.sh the tree or the run?
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps) PYTHONUNBUFFERED=1
N=$PWD
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
common="--model /tmp/q06 --device cuda --prefill-workers 1 --decode-workers 1 --workers 2 --gpus-per-worker 0.5 \
  --num-requests 150 --input-len 100:1024 --output-len 100:512 --slo-ttft 0.5 --slo-tpot 0.05"
(cd $N && PYTHONPATH=$PYTHONPATH:$N timeout 330 python -m scripts.cli bench $common --modes disagg:always,disagg:auto,colocated \
  --rates 16,32 --out /tmp/rep-new 2>&1 | grep -E " ok |prefilled on the decode worker" | sed "s/^/new: /")
(cd $N/.ab/base && PYTHONPATH=$PYTHONPATH:$N/.ab/base timeout 200 python -m scripts.cli bench $common --modes disagg,colocated \
  --rates 32 --out /tmp/rep-old 2>&1 | grep -E " ok " | sed "s/^/old: /")
