# Issue 20's "Show" on this tree, in one call on a fresh H200: stop18_fresh.sh (the offline throughput command
# twice; serve start-up with a cold and a warm kernel cache and the first 20 requests' TTFT against requests 101-120,
# two workers sharing the GPU), then the decode step against the roofline at batch 1 and 64.
nvidia-smi --query-gpu=name,serial --format=csv,noheader
bash docs/gpu_runs/stop18_fresh.sh
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
timeout 100 python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 | grep -vi warn | tail -6
