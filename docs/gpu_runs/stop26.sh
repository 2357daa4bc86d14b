# Stop 26 on the two-GPU kind, three calls on one warm machine (Qwen3-8B, random weights, one GPU a worker):
#   STEP=profile   this machine's 8B profile with the chunk-attention term ($OUT/profile.json, kept in /tmp/stop26
#                  for the later calls); on an H200, issue 20's attention probe and decode step table run meanwhile
#                  on the second GPU, which the profile needs only for its last part, the handoffs
#   STEP=gil       the nccl GPU tests on .ab/switch (branch stop25-gil), then prefill-heavy 1P:1D on main and on
#                  .ab/switch (TREES), each run's results.json and timelines (tar) back, `land` printed
#   STEP=profile2  after the profiler measures its sustained point and fits the floors: Qwen3-8B's profile again
#                  ($OUT/profile-8b.json, its fits printed to $OUT/fits-8b.txt), then Qwen3-0.6B's ($OUT/profile-06b.json)
#   STEP=validate  the other layouts the planner is validated on: long-short 1P:1D and colocated x2, prefill-heavy
#                  colocated x2 (LAYOUTS_LS, LAYOUTS_PH)
# Carry .gpu-deps and .ab. Predictions are made on the CPU from the profile that comes back
# (`pdcluster plan --validate results.json --profile profile.json`).
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps); ROOT=$PWD; KEEP=/tmp/stop26; mkdir -p $KEEP
export PYTHONPATH=$DEPS:$ROOT
nvidia-smi --query-gpu=name,serial --format=csv,noheader | tee $KEEP/gpus.txt
N=${N:-150}
tarball() { tar -czf $2 -C $(dirname $1) $(basename $1) 2>/dev/null; }
case ${STEP:-profile} in
  profile)
    [ -f /tmp/qwen3-8b/config.json ] || python -m scripts.cli prepare-model random --config qwen3-8b \
      --out /tmp/qwen3-8b --overwrite > /dev/null
    if grep -q H200 $KEEP/gpus.txt; then  # issue 20, on the second GPU while the profile measures on the first
      (export CUDA_VISIBLE_DEVICES=1
       timeout 150 python docs/gpu_runs/stop23_attn_probe.py > $OUT/attn-probe.txt 2>&1
       timeout 120 python -m scripts.bench_engine decode --modes graphs --batches 1,64 > $OUT/decode-step.txt 2>&1) &
    fi
    echo "profile from $SECONDS s"
    timeout 430 python -m scripts.cli profile --model /tmp/qwen3-8b --device cuda --model-name Qwen3-8B \
      --out $OUT/profile.json > $OUT/profile-fits.txt 2> $KEEP/profile-progress.txt
    echo "profile rc=$? at $SECONDS s"; tail -2 $KEEP/profile-progress.txt; cp $OUT/profile.json $KEEP/ 2>/dev/null
    wait; grep -E "worst" $OUT/profile-fits.txt | tail -8;;
  profile2)
    [ -f /tmp/qwen3-8b/config.json ] || python -m scripts.cli prepare-model random --config qwen3-8b \
      --out /tmp/qwen3-8b --overwrite > /dev/null
    python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
    for m in 8b:qwen3-8b:Qwen3-8B 06b:q06:Qwen3-0.6B; do IFS=: read tag dir name <<< "$m"
      timeout 280 python -m scripts.cli profile --model /tmp/$dir --device cuda --model-name $name \
        --out $OUT/profile-$tag.json > $OUT/fits-$tag.txt 2> $KEEP/progress-$tag.txt
      echo "$name profile rc=$? at $SECONDS s"; grep -E "sustained|worst" $OUT/fits-$tag.txt
    done;;
  gil)
    (cd .ab/switch && timeout 150 python -m pytest -q -p no:cacheprovider tests/test_kvtransfer_gpu.py -k nccl \
      > $OUT/switch-nccl-tests.txt 2>&1; echo "switch nccl tests rc=$?"; tail -2 $OUT/switch-nccl-tests.txt)
    for tree in ${TREES:-main switch}; do
      dir=$ROOT; [ $tree = main ] || dir=$ROOT/.ab/$tree
      [ -e $dir/.gpu-deps ] || ln -s $ROOT/.gpu-deps $dir/.gpu-deps
      echo "#### $tree from $SECONDS s"
      (cd $dir && OUT=$KEEP/$tree STEP=bench MIX=ph N=$N LAYOUTS=1P1D TIMELINE=1 LIMIT=${LIMIT:-260} \
        bash docs/gpu_runs/splits.sh 2>&1 | grep -v "^GPUS\\|NVIDIA")
      cp $KEEP/$tree/ph/1P1D/results.json $OUT/$tree-ph-1P1D.json 2>/dev/null
      tarball $KEEP/$tree/ph/1P1D-timeline $OUT/$tree-ph-1P1D-timeline.tgz
      python -m scripts.timeline $KEEP/$tree/ph/1P1D-timeline 2>&1 | cut -d'|' -f1,2,8,10
    done;;
  validate)
    for mix in ls ph; do
      [ $mix = ls ] && layouts=${LAYOUTS_LS:-1P1D colo} || layouts=${LAYOUTS_PH:-colo}
      for l in $layouts; do
        echo "#### $mix $l from $SECONDS s"
        OUT=$KEEP/main STEP=bench MIX=$mix N=$N LAYOUTS=$l TIMELINE=1 LIMIT=${LIMIT:-270} \
          bash docs/gpu_runs/splits.sh 2>&1 | grep -v "^GPUS\\|NVIDIA"
        cp $KEEP/main/$mix/$l/results.json $OUT/$mix-$l.json 2>/dev/null
        tarball $KEEP/main/$mix/$l-timeline $OUT/$mix-$l-timeline.tgz
      done
    done;;
esac
echo "done at $SECONDS s"; find $OUT -type f | sort
