# Stop 49: stop 48's long-short benches of branch stop48-mps (serve --mps, 1P:1D time-sliced, colocated), then the
# GPU engine and warm-up tests while time is left. Carry .gpu-deps.
MIX=ls source docs/gpu_runs/stop48_one_gpu_mps.sh
timeout $(left) python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py tests/test_gpu_warmup.py 2>&1 | tail -6
