# Stop 57 (issue 20): `serve`'s start before its workers, on a warm H200 (stop57_startup_probe.py). Carry .gpu-deps.
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD
nvidia-smi --query-gpu=name,serial --format=csv,noheader
[ -f /tmp/q06/config.json ] || python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
for i in 1 2; do python docs/gpu_runs/stop57_startup_probe.py /tmp/q06 router 2>&1 | grep -v "^$" | head -32; done
python -X importtime -c "from router.router import Router" 2>&1 | sort -t'|' -k2 -n | tail -12
for cpus in 17 3 17; do python docs/gpu_runs/stop57_startup_probe.py /tmp/q06 ray $cpus 2>&1 | grep "^ray:"; done
