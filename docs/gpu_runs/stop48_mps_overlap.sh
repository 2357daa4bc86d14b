# Stop 48: `generate` at a 70% MPS share with one setting changed (A/AF, B/BF: names and flags; by default without
# overlapped scheduling, then without late launch): which piece of the decode graphs fails under the cap. Carry
# .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
gen ${A:-no-overlap} ${AF:---no-overlap-scheduling}
gen ${B:-no-late-launch} ${BF:---no-late-launch}
mps_quit
