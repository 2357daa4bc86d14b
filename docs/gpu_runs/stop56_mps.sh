# Stop 56 (issue 21), on a fresh H200, in two calls (STEP=1, then STEP=2 on the warm machine): the blind check of
# stop 55's prefill contention by prompt and this stop's by decode rows (`plan --validate` of both mixes as 1P:1D
# under `serve --mps` against the shipped profile and this machine's), with an eager prompt step's host time on an
# engine of its own first (stop56_eager_probe.py). Carry .gpu-deps.
KEEP=/tmp/stop56mps
source docs/gpu_runs/one_gpu_validation.sh
if [ "${STEP:-1}" = 1 ]; then
  timeout 150 python docs/gpu_runs/stop56_eager_probe.py /tmp/q06 2>&1 | grep -v -i warn | tail -14
  echo "probe done at $SECONDS s"
  profile
  TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
else
  TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
  cp $KEEP/q06-profile.json $OUT/ 2>/dev/null
  timeout $(left) python -m scripts.bench_engine decode --modes graphs --batches 1,64 2>&1 | grep -vi warn | tail -6
fi
