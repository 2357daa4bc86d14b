# Stop 55 (issue 21): the profile's mixed steps at several prompt sizes (256 to 4,096 tokens beside 1, 16 and 64
# decodes; stop55_mixed_grid.patch, applied for the profile and taken off after), then one colocated Qwen3-0.6B
# replica served on both mixes at stop 54's validation rates, for `plan --validate` against this machine's profile.
# Carry .gpu-deps.
KEEP=/tmp/stop55mixed
source docs/gpu_runs/one_gpu_validation.sh
patch -s -p1 < docs/gpu_runs/stop55_mixed_grid.patch
profile
patch -s -R -p1 < docs/gpu_runs/stop55_mixed_grid.patch
grep "mixed:" $OUT/q06-progress.txt
bench ph colocated $PH --rates 8,16,32,64
bench ls colocated $LS --rates 8,16,24,32
