# Issue 20's roofline step on one H200, stop 18 (skinny GEMMs + PDL): the decode step table (`bench_engine decode`
# ("new") and of 426510c ("old", the tree when the issue was written; .ab/issue20), alternating new/old/new/old in
# one call, each warm (its own warm-up inside the command).
export PYTHONUNBUFFERED=1
N=$PWD
DEPS=$(.gpu-deps/unpack .gpu-deps)
nvidia-smi --query-gpu=name --format=csv,noheader
for t in new old new old; do
  if [ $t = new ]; then d=$N; else d=$N/.ab/issue20; fi
  (cd $d && PYTHONPATH=$DEPS:$d timeout 130 python -m scripts.bench_engine decode --modes graphs 2>&1 | grep -vi "warn" | tail -8 | sed "s/^/$t: /")
done
