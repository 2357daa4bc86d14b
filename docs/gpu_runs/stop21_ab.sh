# Stop 21 on one H100: this tree against the last stop's (.ab/old, `git archive a795e09`, carried), one machine.
# STEP=probe: the host's launch work per decode step (stop21_host_prep_probe.py) in both trees.
# STEP=bench: the disaggregated long-short bench of stop 20 (1P+1D at 0.5 GPU each, 300 requests a rate) in both
# trees, old first, then new; results under $OUT/{old,new}/ls.
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps)
ROOT=$PWD
PYTHONPATH=$DEPS:$ROOT python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for tree in old new; do
  dir=$ROOT; [ $tree = old ] && dir=$ROOT/.ab/old
  cd $dir
  export PYTHONPATH=$DEPS:$dir
  if [ "${STEP:-probe}" = probe ]; then
    echo "#### $tree"
    timeout 250 python $ROOT/docs/gpu_runs/stop21_host_prep_probe.py /tmp/q06 1,8,64 2>&1 | grep -v Warn | grep -E "==|^  (launch|upload|_upload|_sampling|sample)|Error|error" 
  else
    timeout 280 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg --prefill-workers 1 \
      --decode-workers 1 --gpus-per-worker 0.5 --num-requests ${N:-300} --workload long-short --input-len 128:512 \
      --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
      --rates ${RATES:-8,16,24} --slo-ttft 1 --slo-tpot 0.03 --out $OUT/$tree/ls 2>&1 | grep -E " ok |error" | tail -6
  fi
done
find $OUT -type f ! -name "*.json" -delete; find $OUT -type f
