# Stop 35 (issue 21's knee): the asyncio client's cheaper streamed token (c62d31e) against the tree before it
# (.ab/base: `git archive 7f41d12 | tar -x -C .ab/base`; carry .ab and .gpu-deps), alternated on one machine of four
# GPUs: Qwen3-8B, 3P:1D, long-short at 32 and 48 req/s, 400 requests, each served with --timeline-dir. Prints each
# bench line, where the short prompts' first tokens waited outside the workers (stop35_outside.py), and
# `pdcluster plan --validate` against stop 26's H200 profile; keeps each run's results.json as $OUT/<name>-<n>.json.
export PYTHONUNBUFFERED=1
ln -sfn $PWD/.gpu-deps .ab/base/.gpu-deps
nvidia-smi --query-gpu=name,serial --format=csv,noheader
n=0
for tree in ${ORDER:-.ab/base . . .ab/base}; do
  n=$((n+1)); name=$([ $tree = . ] && echo client || echo base)
  (cd $tree && OUT=$OUT/run GPUS=4 STEP=bench MIX=ls LAYOUTS=3P1D RATES=${RATES:-32,48} N=400 TIMELINE=1 LIMIT=150 \
     bash docs/gpu_runs/splits.sh 2>&1 | grep -E "req/s|unloaded" | sed "s/^/$name: /")
  python docs/gpu_runs/stop35_outside.py $OUT/run/ls/3P1D/results.json $OUT/run/ls/3P1D-timeline | sed "s/^/$name: /"
  python -m scripts.cli plan --validate $OUT/run/ls/3P1D/results.json --profile scripts/planner/profiles/h200-qwen3-8b.json \
    --out $OUT/val 2>&1 | grep "^disagg" | sed "s/^/$name: /"
  cp $OUT/run/ls/3P1D/results.json $OUT/$name-$n.json; rm -rf $OUT/run $OUT/val
done
