# Stop 54, call 2 (warm, after stop54_call1.sh; carry .gpu-deps): stop 51's served MPS points at `serve --mps`'s
# default decode cap (50%): both mixes as 1P:1D under MPS with the workers' timelines, each role's points against
# call 1's uncapped profile of this machine.
MPS_POINTS_KEEP=/tmp/stop54 PROFILE=0 source docs/gpu_runs/stop51_mps_points.sh
