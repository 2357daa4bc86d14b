# The H100 profile again, now with `mixed_step_s` (a prompt beside decode batches of 1, 16 and 64 against the two
# apart): the planner's colocated and disagg:auto predictions need it. Then, on the CPU, against the lead's benches:
#   pdcluster plan --validate q06-prefill-heavy/results.json --profile h100-q06.json --out q06-prefill-heavy/validation
#   (and q06-long-short, q06-policy likewise)
set -u
export PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
timeout 400 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
  --out $OUT/h100-q06.json > $OUT/full.txt 2> $OUT/progress.txt
tail -5 $OUT/progress.txt; grep -A 6 "^ *mixed: decodes" $OUT/full.txt; grep "mixed_step_s" $OUT/full.txt
