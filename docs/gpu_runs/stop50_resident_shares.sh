# Stop 50: the long-short mix served as 1P:1D under MPS at three settings of the SM shares, each with the workers'
# timelines, for docs/gpu_runs/stop50_mps_gaps.py: does a decode step with a long request in its batch stay slow with
# the decode worker uncapped, or with the two shares adding up to 100%? Carry .gpu-deps. (Since stop 51 through the
# shared `bench`: its files are named q06-ls-disagg-TAG; when it ran they were q06-ls-TAG.)
KEEP=/tmp/stop50
source docs/gpu_runs/one_gpu_validation.sh
TAG=mps70 SERVE=--mps bench ls disagg $LS --rates 8,32
TAG=mps100 SERVE="--mps --mps-shares decode=100" bench ls disagg $LS --rates 8,32
TAG=mps70-30 SERVE="--mps --mps-shares decode=70,prefill=30" bench ls disagg $LS --rates 8,32
