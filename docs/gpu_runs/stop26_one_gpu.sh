# Stop 26 on one GPU (nvidia-h200), two calls on one warm machine:
#   STEP=probe  the prompt steps alone and back to back (stop26_sustained_probe.py, Qwen3-8B), then this machine's
#               Qwen3-0.6B profile ($OUT/q06-profile.json) and the prefill-heavy validation bench on it (1P:1D at
#               half the GPU each, and one colocated replica on all of it; rates 8-64, N a rate)
#   STEP=ls     the long-short validation bench on the same machine (rates 8-32)
# Carry .gpu-deps. `pdcluster plan --validate` runs on the CPU afterwards.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
N=${N:-150}
COMMON="--model /tmp/q06 --device cuda --modes disagg,colocated --prefill-workers 1 --decode-workers 1
  --gpus-per-worker 0.5 --workers 1 --colocated-gpus-per-worker 1 --num-requests $N --slo-tpot 0.03"
left() { echo $(( ${1:-585} - SECONDS )); }
case ${STEP:-probe} in
  probe)
    [ -f /tmp/qwen3-8b/config.json ] || python -m scripts.cli prepare-model random --config qwen3-8b \
      --out /tmp/qwen3-8b --overwrite > /dev/null 2>&1
    timeout 170 python docs/gpu_runs/stop26_sustained_probe.py /tmp/qwen3-8b ${SECONDS_EACH:-12} \
      > $OUT/sustained.txt 2>&1; echo "probe rc=$? at $SECONDS s"; grep -v -i warn $OUT/sustained.txt | tail -40
    python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 --overwrite > /dev/null 2>&1
    timeout 200 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
      --out $OUT/q06-profile.json > $OUT/q06-fits.txt 2> /tmp/q06-progress.txt
    echo "profile rc=$? at $SECONDS s"; grep worst $OUT/q06-fits.txt
    timeout $(left) python -m scripts.cli bench $COMMON --rates 8,16,32,48,64 --input-len 512:2048 \
      --output-len 64:256 --slo-ttft 0.5 --out /tmp/q06-ph 2>&1 | grep -E " ok |rror"
    cp /tmp/q06-ph/results.json $OUT/q06-ph.json 2>/dev/null;;
  ls)
    timeout $(left) python -m scripts.cli bench $COMMON --workload long-short --input-len 128:512 \
      --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 \
      --rates 8,16,24,32 --slo-ttft 1 --out /tmp/q06-ls 2>&1 | grep -E " ok |rror"
    cp /tmp/q06-ls/results.json $OUT/q06-ls.json 2>/dev/null;;
esac
echo "done at $SECONDS s"; find $OUT -type f | sort
