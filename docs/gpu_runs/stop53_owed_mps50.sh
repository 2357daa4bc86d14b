# Owed since stop 53: the one-GPU MPS model at `serve --mps`'s decode cap of 50% (stops 48-52 capped decode at 70%,
# where cuBLAS's products were wrong). On a fresh machine, in two calls (KEEP survives while the machine is warm):
#   STEP=points: the profile as an MPS client at 50% (decode `alone`: its decode steps over the uncapped profile's),
#                then stop 51's run at the new default: the machine's profile, both mixes as 1P:1D under
#                `serve --mps` with the workers' timelines, and `scripts.timeline --mps-points` on them;
#   STEP=colo:   one colocated replica on the same GPU, both mixes (the validation's other layout).
# Then on the CPU: the profile's `mps` from these and `pdcluster plan --validate` on the results. Carry .gpu-deps.
KEEP=/tmp/stop51
source docs/gpu_runs/one_gpu_validation.sh
source docs/gpu_runs/stop48_mps_client.sh
case ${STEP:-points} in
  points)
    mps_start
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 timeout $(left 240) python -m scripts.cli profile --model /tmp/q06 \
      --device cuda --model-name Qwen3-0.6B --out $OUT/q06-profile-mps50.json > $KEEP/q06-fits-mps50.txt 2>&1
    echo "capped profile rc=$? at $SECONDS s"
    mps_quit
    source docs/gpu_runs/stop51_mps_points.sh ;;
  colo)
    bench ph colocated $PH --rates 8,16,32,64
    bench ls colocated $LS --rates 8,16,24,32 ;;
esac
