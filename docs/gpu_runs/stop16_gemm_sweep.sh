set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
timeout 500 python -m scripts.bench_gemm --rows 1,2,4,8,16,32,64 --sweep 1,64 2>&1 | grep -v -i warn
