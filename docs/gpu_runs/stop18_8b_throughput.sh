# Stop 18 on one H200: the Qwen3-8B decode step table, this tree ("new") against 426510c ("old", .ab/issue20),
# then the offline throughput command twice on this tree (issue 20: the same figure within 5%).
export PYTHONUNBUFFERED=1
N=$PWD
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name --format=csv,noheader
for t in new old; do
  if [ $t = new ]; then d=$N; else d=$N/.ab/issue20; fi
  (cd $d && PYTHONPATH=$DEPS:$d timeout 200 python -m scripts.bench_engine decode --modes graphs --config qwen3-8b 2>&1 | grep -vi "warn" | grep -E "^graphs " | sed "s/^/$t 8b: /")
done
for i in 1 2; do
  PYTHONPATH=$DEPS:$N timeout 120 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 | grep -vi warn | grep -iE "tok/s|throughput" | sed "s/^/run $i: /"
done
