# Stop 57 (issues 20, 21) on 4ae1bf1's engine. STEP=1 on a fresh H200: issue 20's Show (stop32_show.sh). STEP=2 on
# the warm machine: the one-GPU GPU suite. STEP=3: one colocated replica on both mixes at the validation rates with
# timelines (for `plan --validate` against the shipped profile, blind), then 1P:1D under `serve --mps` on
# prefill-heavy with timelines (the handoff's pause marks). Carry .gpu-deps.
KEEP=/tmp/stop57
case ${STEP:-1} in
  1) bash docs/gpu_runs/stop32_show.sh;;
  2) export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
     nvidia-smi --query-gpu=name,serial --format=csv,noheader
     timeout 560 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/test_http.py \
       --ignore=tests/test_kvtransfer_gpu.py --ignore=tests/test_multinode_gpu.py 2>&1 | tail -8;;
  3) source docs/gpu_runs/one_gpu_validation.sh
     bench ph colocated $PH --rates 8,16,32,64
     bench ls colocated $LS --rates 8,16,24,32
     [ $(left) -gt 150 ] && TAG=mps SERVE=--mps bench ph disagg $PH --rates 32,64;;
esac
