# Stop 52: stop 51's owed run. The GPU tests of late launch on the final tree (0e4c109 gated the early clock to MPS
# clients; its test names an MPS pipe), the rest of the engine's GPU tests, then the long-short mix as 1P:1D under
# `serve --mps` at 8 and 32 req/s with the workers' timelines: do decode intervals after a long prompt stay at their
# GPU time (x1.0)? Carry .gpu-deps.
KEEP=/tmp/stop52
source docs/gpu_runs/one_gpu_validation.sh
timeout 240 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py 2>&1 | tail -4
echo "tests done at $SECONDS s"
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,32
python -m scripts.timeline $KEEP/ls-disagg-mps-timeline
