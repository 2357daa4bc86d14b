# Stop 34 (issue 21's knee): the nccl sender posting its KV on the worker's thread against on its link thread (stop
# 33's tree, .ab/base with a link to .gpu-deps), one after the other on one machine of four GPUs. As run, "this tree"
# had `post_here=True` in NcclTransport.send's `link.run(...)`; that change was measured and reverted (docs/
# benchmarks.md, stop 34), so rerunning it needs the change put back. Qwen3-8B,
# 3P:1D, long-short at 48 req/s, 400 requests, each served with --timeline-dir; prints the bench's line and the
# timeline's parts (`land`: the KV record at the decode worker -> landed).
export PYTHONUNBUFFERED=1
ln -sfn $PWD/.gpu-deps .ab/base/.gpu-deps
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in .ab/base .; do
  name=$([ $tree = . ] && echo new || echo base)
  (cd $tree && OUT=$OUT/$name GPUS=4 STEP=bench MIX=ls LAYOUTS=3P1D RATES=48 N=400 TIMELINE=1 LIMIT=150 \
     bash docs/gpu_runs/splits.sh 2>&1 | grep -E "req/s|unloaded" | sed "s/^/$name: /"
   PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD python -m scripts.timeline $OUT/$name/ls/3P1D-timeline 2>&1 | tail -2 | sed "s/^/$name: /")
  rm -rf $OUT/$name/ls/3P1D-timeline
done
