# Stop 32 (CPU only, on the GPU host's 16 cores): how long `pdcluster plan` takes for 128 GPUs behind the routers its
# rates need, with --jobs 1, 8 and 16, on stop 32's two mixes (docs/benchmarks.md, "Stop 32").
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"
LS="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16 --long-fraction 0.2 --slo-ttft 1"
PH="--input-len 512:2048 --output-len 64:256 --slo-ttft 0.5"
for jobs in ${JOBS:-8 16 1}; do
  for mix in ls ph; do
    F=$LS; [ $mix = ph ] && F=$PH
    TIMEFORMAT="jobs $jobs $mix ${N:-2500} requests: wall %R s, CPU %U s (this process), %S s system"
    time python -m scripts.cli plan --profile scripts/planner/profiles/h200-qwen3-8b.json --gpus 128 \
      --disagg-policies always --rates 1024,1536,2048 --slo-tpot 0.03 --num-requests ${N:-2500} --jobs $jobs $F \
      > /tmp/plan-$jobs-$mix.txt 2> /dev/null
    grep "^recommendation" /tmp/plan-$jobs-$mix.txt | cut -c1-120
  done
done
