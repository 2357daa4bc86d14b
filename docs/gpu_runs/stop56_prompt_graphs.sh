# Stop 56: stop56_prompt_graphs_probe.py on Qwen3-0.6B, then on Qwen3-8B (random weights). Carry .gpu-deps.
set -u
export PYTHONPATH=$(.gpu-deps/unpack .gpu-deps):$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,serial --format=csv,noheader
[ -f /tmp/q06/config.json ] || python -m scripts.cli prepare-model random --config qwen3-0.6b --out /tmp/q06 > /dev/null 2>&1
timeout 200 python docs/gpu_runs/stop56_prompt_graphs_probe.py /tmp/q06 2>&1 | grep -v -i "warn\|USDT"
echo "0.6B done at $SECONDS s"
[ -f /tmp/q8/config.json ] || timeout 200 python -m scripts.cli prepare-model random --config qwen3-8b --out /tmp/q8 > /dev/null 2>&1
echo "8B prepared at $SECONDS s"
timeout $((580 - SECONDS)) python docs/gpu_runs/stop56_prompt_graphs_probe.py /tmp/q8 --reps 3 --profile-ops 0 2>&1 | grep -v -i "warn\|USDT"
echo "done at $SECONDS s"
