# Stop 53: where the NaN rows under a 70% MPS share start (docs/gpu_runs/stop53_nan_hooks.py). Carry .gpu-deps.
G3_ONLY=1 source docs/gpu_runs/stop53_mps_eager.sh
mps_start
PATCH="import docs.gpu_runs.stop53_nan_hooks as H; H.install()" g3 s70-eager-hooks --enforce-eager
grep -m5 "NAN in" $KEEP/g3-s70-eager-hooks.log | cut -c1-300
grep -m3 -iE "error|Traceback" $KEEP/g3-s70-eager-hooks.log | cut -c1-200
mps_quit
