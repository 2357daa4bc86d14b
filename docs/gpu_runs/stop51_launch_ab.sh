# Stop 51: late launch's clock after a long prompt under MPS. The decode worker learned its step's GPU time as an
# average, which steps beside a long prompt (about 3x under MPS) raised, and it then waited that long after the
# prompt ended. This tree's clock follows a faster step at once and launches as soon as the step in flight is done.
# The long-short mix as 1P:1D under `serve --mps`, this tree against the tree before (ab_old/: the three files it
# changed, swapped in for the old runs), alternated, with the workers' timelines and their decode-step reports.
# First the GPU tests of late launch. Carry .gpu-deps; ab_old/ travels untracked.
KEEP=/tmp/stop51
source docs/gpu_runs/one_gpu_validation.sh
FILES="common/engine/launch_clock.py common/engine/llm_engine.py common/worker/runtime.py"
mkdir -p $KEEP/new && for f in $FILES; do mkdir -p $KEEP/new/$(dirname $f); cp $f $KEEP/new/$f; done
use() { for f in $FILES; do cp $1/$f $f; done; }
timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py -k "late_launch or clock_said" 2>&1 \
  | tail -3
for round in 1 2; do
  for tree in new old; do
    use $([ $tree = new ] && echo $KEEP/new || echo ab_old)
    TAG=mps-$tree$round SERVE=--mps bench ls disagg $LS --rates 8,16,32
    python -m scripts.timeline $KEEP/ls-disagg-mps-$tree$round-timeline | grep "decode steps"
    [ $round = 1 ] || rm -f $OUT/q06-ls-disagg-mps-$tree$round-timeline.tgz
  done
done
use $KEEP/new
