# Stop 34 (issue 20): the first requests through a new cluster, this tree (the protocol's decoder built at import)
# against stop 33's (.ab/base, built on each process's first frame), alternated on one machine. Each run serves two
# Qwen3-0.6B workers on the GPU and prints every request's TTFT, the first 40 and 101-140
# (docs/gpu_runs/stop16_serve_start.py with EACH=1; requests i and i+100 have the same shape).
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name,serial --format=csv,noheader
PYTHONPATH=$DEPS:$PWD python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_first34 EACH=1
run() {  # tree label port mode
  (cd $1 && PYTHONPATH=$DEPS:$PWD timeout 100 python $OLDPWD/docs/gpu_runs/stop16_serve_start.py /tmp/q06 $2 $3 $4 2>&1 | grep -E "^$2")
}
run . new-colocated-cold 5701 colocated
for mode in ${MODES:-colocated disagg}; do
  run .ab/base base-$mode-warm 5702 $mode
  run . new-$mode-warm 5703 $mode
done
