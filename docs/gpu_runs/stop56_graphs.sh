# Stop 56 (issues 21, 20): prompt graphs to the whole step budget (the new default). STEP=1 on a fresh H200: the
# engine's GPU tests, this machine's profile, prefill-heavy as 1P:1D under `serve --mps` with timelines; STEP=2 on
# the warm machine: long-short the same way; STEP=3 (a fresh machine, blind): both mixes again, then their two top
# rates with prompt graphs to 2,048 tokens as before (`--prefill-graph-max-tokens 2048`), on the same machine.
# Carry .gpu-deps.
KEEP=/tmp/stop56graphs
source docs/gpu_runs/one_gpu_validation.sh
case ${STEP:-1} in
  1) timeout 260 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py tests/test_gpu_warmup.py \
       2>&1 | tail -4
     echo "tests done at $SECONDS s"
     profile
     TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64;;
  2) TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
     cp $KEEP/q06-profile.json $OUT/ 2>/dev/null;;
  3) TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
     TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
     TAG=mps2048 SERVE="--mps --prefill-graph-max-tokens 2048" bench ph disagg $PH --rates 32,64
     TAG=mps2048 SERVE="--mps --prefill-graph-max-tokens 2048" bench ls disagg $LS --rates 24,32;;
esac
