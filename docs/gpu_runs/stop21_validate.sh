# Stop 21 on one H100 (issue 21): stop20_validate.sh (MIX, PROFILE, N as there) with the workers' timelines
# (`serve --timeline-dir`, split by scripts/timeline.py) and UNLOADED unloaded requests for the validation's offset.
set -u
MIX=${MIX:-ph}
EXTRA="--serve-args=--timeline-dir=/tmp/timeline-$MIX --unloaded-requests ${UNLOADED:-8}" MIX=$MIX \
  bash docs/gpu_runs/stop20_validate.sh
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
echo "## timelines, prompts of at most 2048 tokens"; python -m scripts.timeline /tmp/timeline-$MIX --max-tokens 2048
mkdir -p $OUT/timeline-$MIX && cp /tmp/timeline-$MIX/*.jsonl $OUT/timeline-$MIX/ && find $OUT -type f
