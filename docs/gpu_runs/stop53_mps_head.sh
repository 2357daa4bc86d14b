# Stop 53: why the fused LM head and sampler's CUDA graph fails under a 70% MPS share (stop 48): `generate` as an
# MPS client with the fused head let in (`gate_off`), then with one change each (docs/gpu_runs/stop53_mps_patches.py).
# Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
mps_start
P="import docs.gpu_runs.stop53_mps_patches as P; P.gate_off(); P.log_tokens()"
SHARE=100 PATCH="$P" gen s100-fused
PATCH="$P" gen s70-fused
PATCH="$P; P.own_pool()" gen s70-own-pool
PATCH="$P; P.filled()" gen s70-filled
PATCH="import docs.gpu_runs.stop53_mps_patches as P; P.gate_off(); P.no_sampler_graphs()" gen s70-eager-head
PATCH="$P" gen s70-fused-bs1 --cuda-graph-max-bs 1
for f in s100-fused s70-fused s70-own-pool s70-filled s70-fused-bs1; do
  echo "== $f"; grep -m4 TOKENS $KEEP/gen-$f.log | cut -c1-200; grep -m2 -E "Assertion|Error" $KEEP/gen-$f.log | cut -c1-200
done
mps_quit
