# `pdcluster profile` with the prefill cost fitted as two lines (graphed / eager prompt steps): Qwen3-0.6B, then
# Qwen3-8B, on one H100.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
for c in qwen3-0.6b qwen3-8b; do
  python -m scripts.cli prepare-model random --config $c --out /tmp/$c --overwrite > /dev/null 2>&1
done
timeout 150 python -m scripts.cli profile --model /tmp/qwen3-0.6b --device cuda --model-name Qwen3-0.6B \
  --out $OUT/h100-qwen3-0.6b.json > $OUT/q06.txt 2> $OUT/q06-progress.txt; tail -1 $OUT/q06-progress.txt
grep -E "prefill|worst" $OUT/q06.txt | tail -8
timeout 300 python -m scripts.cli profile --model /tmp/qwen3-8b --device cuda --model-name Qwen3-8B \
  --out $OUT/h100-qwen3-8b.json > $OUT/q8b.txt 2> $OUT/q8b-progress.txt; tail -1 $OUT/q8b-progress.txt
grep -E "prefill|worst" $OUT/q8b.txt | tail -8
rm -f $OUT/*progress.txt
