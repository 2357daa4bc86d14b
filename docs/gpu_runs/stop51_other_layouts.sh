# Stop 51: the layouts the MPS runs left out, on this engine. One colocated replica on the whole GPU, both mixes
# (`plan --validate` against the shipped profile, measured at stop 51 on another H200); then 1P:1D time-sliced on
# the long-short mix, this tree against the tree before late launch's mend (ab_old/: its three files), to see that
# the mend changes nothing where the GPU is taken in turns (`ORDER="old new"`: that pair alone, old first).
# Carry .gpu-deps; ab_old/ travels untracked.
KEEP=/tmp/stop51
source docs/gpu_runs/one_gpu_validation.sh
FILES="common/engine/launch_clock.py common/engine/llm_engine.py common/worker/runtime.py"
mkdir -p $KEEP/new && for f in $FILES; do mkdir -p $KEEP/new/$(dirname $f); cp $f $KEEP/new/$f; done
use() { for f in $FILES; do cp $1/$f $f; done; }
if [ -z "${ORDER:-}" ]; then  # ORDER="old new": only the time-sliced pair, the old tree first
  bench ph colocated $PH --rates 8,16,32,64
  bench ls colocated $LS --rates 8,16,24,32
fi
for tree in ${ORDER:-new old}; do
  use $([ $tree = new ] && echo $KEEP/new || echo ab_old)
  TAG=slices-$tree bench ls disagg $LS --rates 8,32
  python -m scripts.timeline $KEEP/ls-disagg-slices-$tree-timeline | grep "decode steps"
  rm -f $OUT/q06-ls-disagg-slices-$tree-timeline.tgz
done
use $KEEP/new
