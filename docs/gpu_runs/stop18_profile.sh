# `pdcluster profile` of Qwen3-0.6B on one H100 with the decode cost fitted as two lines (skinny GEMMs up to 2
# sequences, cuBLAS past them); the validation benches are stop18_validate.sh's (same engine).
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
timeout 150 python -m scripts.cli profile --model /tmp/q06 --device cuda --model-name Qwen3-0.6B \
  --out $OUT/h100-qwen3-0.6b.json > $OUT/q06.txt 2> $OUT/q06-progress.txt; tail -1 $OUT/q06-progress.txt
sed -n '/decode batch/,/worst/p' $OUT/q06.txt
grep -E "worst|decode" $OUT/q06.txt | tail -6
rm -f $OUT/q06-progress.txt
