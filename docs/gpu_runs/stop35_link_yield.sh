# Stop 35 (issue 21's knee, from stop 34's trace): a KV worker's thread pausing LINK_YIELD_S each time it polls a
# running step while a transfer is in flight (2505e8e) against the tree before it
# (.ab/base: `git archive 5c40299 | tar -x -C .ab/base`; carry .ab and .gpu-deps), alternated on one machine of four
# GPUs: Qwen3-8B, 3P:1D, long-short at 32 and 48 req/s, 400 requests, each served with --timeline-dir. Prints each
# bench line (TTFT and TPOT: the pause must not cost the decode steps) and the timeline's parts per load point
# (`land`: the KV record at the decode worker -> landed; `send`).
export PYTHONUNBUFFERED=1
ln -sfn $PWD/.gpu-deps .ab/base/.gpu-deps
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in ${ORDER:-.ab/base . . .ab/base}; do
  name=$([ $tree = . ] && echo yield || echo base)
  (cd $tree && OUT=$OUT/run GPUS=4 STEP=bench MIX=ls LAYOUTS=3P1D RATES=${RATES:-32,48} N=400 TIMELINE=1 LIMIT=150 \
     bash docs/gpu_runs/splits.sh 2>&1 | grep -E "req/s|unloaded" | sed "s/^/$name: /"
   PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD python -m scripts.timeline $OUT/run/ls/3P1D-timeline 2>&1 \
     | tail -4 | sed "s/^/$name: /")
  rm -rf $OUT/run
done
