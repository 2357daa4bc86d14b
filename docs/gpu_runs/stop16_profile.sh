set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 2>&1 | tail -1
/usr/bin/time -f "quick wall %e s" timeout 250 python -m scripts.cli profile --model /tmp/q06 --model-name Qwen3-0.6B --quick --out $OUT/h100-q06-quick.json > $OUT/quick.txt 2> $OUT/quick.err; tail -3 $OUT/quick.err; tail -40 $OUT/quick.txt
/usr/bin/time -f "full wall %e s" timeout 330 python -m scripts.cli profile --model /tmp/q06 --model-name Qwen3-0.6B --out $OUT/h100-q06.json > $OUT/full.txt 2> $OUT/full.err; tail -3 $OUT/full.err; tail -60 $OUT/full.txt
