# Two-batch overlap, why it is slower: kernel time summed vs wall under the profiler (overlap shows as a sum
# above the wall), then the step with leaner attention launches (fewer stages or warps), one and two batches.
export PYTHONUNBUFFERED=1
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
for mb in 0 2; do
  timeout 100 python -m scripts.bench_engine profile --batch 64 --decode-overlap-min-batch $mb 2>&1 | grep -vi warn | head -22
done
for launch in "64 4 2" "64 4 1" "32 4 1" "64 2 2"; do
  timeout 150 python docs/gpu_runs/stop22_tbo_probe.py $launch decode --modes one-batch,two-batch --batches 64,256 2>&1 \
    | grep -E '^(decode launch|graphs)' | grep -v idle
done
