# Issue 20's "Show" on this tree, in one call on a fresh H200 (as stop18_fresh.sh, with the decode step table): the
# offline throughput command twice; serve start-up with a cold and a warm kernel cache and the first 20 requests'
# TTFT against requests 101-120 (two workers sharing the GPU); the decode step against the roofline at batch 1 and 64.
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
for i in 1 2; do
  timeout 120 python -m scripts.bench_engine throughput --hf-seqs 0 2>&1 | grep -vi warn | grep -E "^pdcluster" | sed "s/^/throughput run $i: /"
done
python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
export TRITON_CACHE_DIR=/tmp/tc_serve32
timeout 80 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-cold 5701 colocated
timeout 80 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 colocated-warm 5702 colocated
timeout 80 python docs/gpu_runs/stop16_serve_start.py /tmp/q06 disagg-warm 5703 disagg
unset TRITON_CACHE_DIR
timeout 100 python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 | grep -vi warn | tail -6
