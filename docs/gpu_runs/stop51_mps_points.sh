# Stop 51: the MPS contention the planner reads by the longest prompt of a pair (`MpsCost.beside_by_prompt`),
# measured from served step times. On a fresh machine: its profile by this tree; then both mixes as 1P:1D under
# `serve --mps` with the workers' timelines; `scripts.timeline --mps-points` prints each role's points against the
# machine's profile. `plan --validate` then runs on this machine (CPU) with this machine's profile and points.
# Carry .gpu-deps. MPS_POINTS_KEEP: another folder kept between calls; PROFILE=0: the profile there already.
KEEP=${MPS_POINTS_KEEP:-/tmp/stop51}
source docs/gpu_runs/one_gpu_validation.sh
[ "${PROFILE:-1}" = 0 ] || profile
TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
for mix in ph ls; do
  python -m scripts.timeline $KEEP/$mix-disagg-mps-timeline --mps-points --profile $KEEP/q06-profile.json \
    | grep -E "decode steps|^mps"
done
