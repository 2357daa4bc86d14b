set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -m scripts.bench_engine decode --modes graphs 2>&1 | grep -v -i warn | tail -12
python -m scripts.bench_engine profile --batch 1 2>&1 | grep -v -i warn | tail -28
python -m scripts.bench_engine profile --batch 64 2>&1 | grep -v -i warn | tail -28
