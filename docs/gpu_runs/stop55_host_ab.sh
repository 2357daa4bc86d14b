# Stop 55 (issue 21): did stop 54's smaller host work (numpy prompt packing, a prompt's blocks converted once) close
# a colocated Qwen3-0.6B replica's GPU idle at prefill-heavy 64 req/s? The replica on this tree ("new") and with
# stop55_old_host.patch applied (b40b7b6's step_inputs, block_manager, prefix_hash: "old"), in the order ORDER
# (default "new old"), late launch on. TESTS=1 first runs the GPU tests owed on the tree. Carry .gpu-deps.
KEEP=/tmp/stop55ab
N=${N:-200}
source docs/gpu_runs/one_gpu_validation.sh
if [ "${TESTS:-0}" = 1 ]; then
  timeout $(left 400) python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_engine.py tests/test_gpu_warmup.py \
    2>&1 | tail -6
  echo "tests done at $SECONDS s"
fi
for tree in ${ORDER:-new old}; do
  [ $tree = old ] && patch -s -p1 < docs/gpu_runs/stop55_old_host.patch
  TAG=$tree$SECONDS bench ph colocated $PH --rates 64
  [ $tree = old ] && patch -s -R -p1 < docs/gpu_runs/stop55_old_host.patch
done
python - <<'PY'
import glob, json, os
for f in sorted(glob.glob("/tmp/stop55ab/ph-colocated-*/results.json"), key=os.path.getmtime):
    p = json.load(open(f))["runs"][-1]["points"][-1]
    e = p["engines"][0]
    print(f.split("/")[-2], f"busy {e['busy_seconds']:.3f} s, GPU {e['gpu_seconds']:.3f} s, "
          f"idle {100 * (1 - e['gpu_seconds'] / e['busy_seconds']):.1f}%, steps {e['busy_steps']}, "
          f"goodput {p['summary']['goodput']:.1f}, TTFT p50 {p['summary']['ttft']['p50']:.3f}")
PY
