set -u
export PYTHONUNBUFFERED=1
ROOT=$PWD
echo "== startup child, 5 requests"
timeout 100 python -m scripts.bench_startup --child --root /tmp/bs --requests 5 2>&1 | tail -5
for rep in 1; do
for tree in old new nodns noalign newnowarm old new; do
  dir=$ROOT/.ab/$tree; flag=""
  [ $tree = new ] && dir=$ROOT
  [ $tree = newnowarm ] && dir=$ROOT && flag=--no-warmup
  echo "== $tree (rep $rep)"
  (cd $dir && PYTHONPATH=$DEPS:$dir timeout 100 python $ROOT/docs/gpu_runs/stop15_eager.py $flag 2>&1 | grep -E "^(eager|graphs)|Error" )
done
done
