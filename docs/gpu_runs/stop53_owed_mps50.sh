# Owed since stop 53: the one-GPU MPS model at `serve --mps`'s decode cap of 50% (stops 48-52 capped decode at 70%,
# where cuBLAS's products were wrong). On a fresh machine, in two calls (KEEP survives while the machine is warm):
#   STEP=points: the machine's profile, uncapped and as an MPS client at 50% (decode `alone`); both mixes as 1P:1D
#                under `serve --mps` with the workers' timelines, and `scripts.timeline --mps-points` on them;
#   STEP=colo:   one colocated replica on the same GPU, both mixes (the validation's other layout).
# Then on the CPU: the profile's `mps` from these (alone = capped / uncapped decode steps; the points as printed) and
# `pdcluster plan --validate` on the results against it. Carry .gpu-deps.
KEEP=/tmp/stop53
source docs/gpu_runs/one_gpu_validation.sh
source docs/gpu_runs/stop48_mps_client.sh
case ${STEP:-points} in
  points)
    profile
    mps_start
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout $(left 300) python -m scripts.cli profile --model /tmp/q06 \
      --device cuda --model-name Qwen3-0.6B --out $OUT/q06-profile-mps50.json > $KEEP/q06-fits-mps50.txt 2>&1
    echo "capped profile rc=$? at $SECONDS s"
    mps_quit
    TAG=mps SERVE=--mps bench ph disagg $PH --rates 8,16,32,64
    TAG=mps SERVE=--mps bench ls disagg $LS --rates 8,16,24,32
    for mix in ph ls; do
      python -m scripts.timeline $KEEP/$mix-disagg-mps-timeline --mps-points --profile $KEEP/q06-profile.json \
        | grep -E "decode steps|^mps"
    done ;;
  colo)
    bench ph colocated $PH --rates 8,16,32,64
    bench ls colocated $LS --rates 8,16,24,32 ;;
esac
