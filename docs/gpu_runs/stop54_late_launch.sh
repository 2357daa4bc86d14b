# Stop 54 (issue 21): one colocated Qwen3-0.6B replica at prefill-heavy 64 req/s (past capacity) sat idle 3.8% of
# its busy time; does late launch hold it? The replica with and without `--no-late-launch`, alternated, on a fresh
# machine. Carry .gpu-deps.
KEEP=/tmp/stop54ll
N=${N:-200}
source docs/gpu_runs/one_gpu_validation.sh
for round in 1 2; do
  TAG=late$round bench ph colocated $PH --rates 64
  TAG=nolate$round SERVE=--no-late-launch bench ph colocated $PH --rates 64
done
python - <<'PY'
import glob, json
for f in sorted(glob.glob("/tmp/stop54ll/ph-colocated-*/results.json")):
    p = json.load(open(f))["runs"][-1]["points"][-1]
    e = p["engines"][0]
    print(f.split("/")[-2], f"busy {e['busy_seconds']:.3f} s, GPU {e['gpu_seconds']:.3f} s, "
          f"idle {100 * (1 - e['gpu_seconds'] / e['busy_seconds']):.1f}%, steps {e['busy_steps']}")
PY
