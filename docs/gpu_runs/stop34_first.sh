# Stop 34 (issue 20): a new cluster's first requests, traced (docs/gpu_runs/stop34_first_trace.py: disaggregated on
# a cold then a warm kernel cache, colocated warm; requests 0-3 against 20-23, the same shapes), then the cuda_ipc
# tests (the transport's `open` sets a pair up before its first handoff).
export PYTHONUNBUFFERED=1 PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD TRITON_CACHE_DIR=/tmp/tc34
nvidia-smi --query-gpu=name,serial --format=csv,noheader
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
for m in disagg disagg colocated; do
  timeout 120 python docs/gpu_runs/stop34_first_trace.py /tmp/q06 $m 44 2>&1 | grep -E "^$m" | sed -n '1,5p;22,25p'
done
grep -h "KV link" /tmp/first34-disagg.log | head -3
timeout 300 python -m pytest -q -p no:cacheprovider -m gpu tests/test_kvtransfer_gpu.py -k cuda_ipc 2>&1 | tail -3
