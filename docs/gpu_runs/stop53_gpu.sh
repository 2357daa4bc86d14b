# Stop 53: the GPU tests of the scheduler's `schedule(running, decoding_apart)` and of the fused head let into
# MPS-capped processes (at first with the LM head and sampler's graphs in a pool of their own, a change later undone),
# `generate` capped and uncapped, and the decode step against the roofline. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
git log --oneline -1 2>/dev/null
timeout $(left 330) python -m pytest -q -p no:cacheprovider -m gpu tests/test_mps_gpu.py tests/test_head_sampler.py \
  tests/test_gpu_engine.py tests/test_gpu_warmup.py 2>&1 | tail -4
mps_start
SHARE=100 gen s100
gen s70
gen s70-bs1 --cuda-graph-max-bs 1
mps_quit
for f in s100 s70 s70-bs1; do echo "$f: $(grep -E '^\{' $KEEP/gen-$f.log | cut -c1-400)"; done
timeout $(left 560) python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 | grep -E "batch|roofline|ms" | tail -8
