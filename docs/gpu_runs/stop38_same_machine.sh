# Stop 38 (issue 21): the planner's validations with profiles measured on the machine the runs are on, minutes
# before them, rather than the stored profiles (measured at stop 26 on other machines of the kind). One call on four
# GPUs (Qwen3-8B and Qwen3-0.6B random weights, long-short):
#   GPUs 0,1  Qwen3-8B's profile (nccl handoffs between them)          -> $OUT/profile-8b.json
#   GPU 2     meanwhile, Qwen3-0.6B's profile on one GPU                -> $OUT/profile-06b.json
#   GPU 3     meanwhile, Qwen3-0.6B 1P:1D at half the GPU each, 24 and 32 req/s, 300 requests (stop 35's one-GPU
#             run), with timelines                                     -> $OUT/q06/
#   all four  then Qwen3-8B 3P:1D at 32 and 48 req/s, 400 requests (stop 37's knee, its draw), with timelines
#                                                                       -> $OUT/knee/
# The predictions are made on the CPU: `pdcluster plan --validate RESULTS --profile P` with each profile.
# Carry .gpu-deps.
set -u
export PYTHONUNBUFFERED=1
DEPS=$(.gpu-deps/unpack .gpu-deps); export PYTHONPATH=$DEPS:$PWD
nvidia-smi --query-gpu=index,name,serial --format=csv,noheader
python -m scripts.cli prepare-model random --config qwen3-8b --out /tmp/qwen3-8b > /dev/null 2>&1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
echo "models at $SECONDS s"
LS="--workload long-short --input-len 128:512 --output-len 128:512 --long-input-len 4096:8192 --long-output-len 4:16
    --long-fraction 0.2 --slo-ttft 1 --slo-tpot 0.03"
timeline() {  # DIR NAME: the run's timeline folder back as one file, its handoff parts printed
  python -m scripts.timeline $1/timeline --max-tokens 2048 2>&1 | tail -12
  tar -czf $OUT/$2-timeline.tgz -C $1 timeline && rm -rf $1/timeline
  find $1 -type f ! -name "*.json" -delete
}
(export CUDA_VISIBLE_DEVICES=2
 timeout 300 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
   --out $OUT/profile-06b.json > $OUT/fits-06b.txt 2> /tmp/progress-06b.txt
 echo "0.6B profile rc=$? at $SECONDS s"; grep -E "sustained|worst" $OUT/fits-06b.txt | tail -4) &
(export CUDA_VISIBLE_DEVICES=3
 timeout 300 python -m scripts.cli bench --model /tmp/q06 --device cuda --modes disagg --prefill-workers 1 \
   --decode-workers 1 --gpus-per-worker 0.5 --num-requests 300 --rates 24,32 $LS \
   --serve-args=--timeline-dir=$OUT/q06/timeline --out $OUT/q06 2>&1 | grep -E " ok |rror" | sed "s/^/q06: /"
 echo "0.6B bench done at $SECONDS s"; timeline $OUT/q06 q06) &
CUDA_VISIBLE_DEVICES=0,1 timeout 330 python -m scripts.cli profile --model /tmp/qwen3-8b --device cuda \
  --model-name Qwen3-8B --out $OUT/profile-8b.json > $OUT/fits-8b.txt 2> /tmp/progress-8b.txt
echo "8B profile rc=$? at $SECONDS s"; tail -1 /tmp/progress-8b.txt; grep -E "sustained|worst" $OUT/fits-8b.txt | tail -4
wait
echo "## knee from $SECONDS s"
timeout ${LIMIT:-200} python -m scripts.cli bench --model /tmp/qwen3-8b --device cuda --modes disagg --prefill-workers 3 \
  --decode-workers 1 --gpus-per-worker 1 --rates 32,48 --num-requests 400 $LS \
  --serve-args=--timeline-dir=$OUT/knee/timeline --out $OUT/knee 2>&1 | grep -E " ok |rror"
echo "knee done at $SECONDS s"; timeline $OUT/knee knee
