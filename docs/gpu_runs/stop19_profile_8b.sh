# Stop 19 on one H100: the Qwen3-8B profile on this tree (decode points over spread contexts, the skinny line, the
# decode plan of a wave and a half), for `pdcluster plan`'s 8B predictions.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-8b --out /tmp/qwen3-8b --overwrite > /dev/null 2>&1
timeout 420 python -m scripts.cli profile --model /tmp/qwen3-8b --device cuda --model-name Qwen3-8B \
  --out $OUT/h100-qwen3-8b.json > $OUT/q8b.txt 2> $OUT/q8b-progress.txt; tail -1 $OUT/q8b-progress.txt
grep -E "worst" $OUT/q8b.txt | tail -8
rm -f $OUT/*progress.txt
