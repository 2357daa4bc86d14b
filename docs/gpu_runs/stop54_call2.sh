# Stop 54, call 2 (warm, after stop54_call1.sh; carry .gpu-deps): stop 51's served MPS points at `serve --mps`'s
# default decode cap (50%): both mixes as 1P:1D under MPS with the workers' timelines, each role's points against
# call 1's uncapped profile of this machine.
KEEP=/tmp/stop54
source docs/gpu_runs/one_gpu_validation.sh
ls $KEEP
TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
for mix in ph ls; do
  python -m scripts.timeline $KEEP/$mix-disagg-mps-timeline --mps-points --profile $KEEP/q06-profile.json \
    | grep -E "decode steps|^mps"
done
