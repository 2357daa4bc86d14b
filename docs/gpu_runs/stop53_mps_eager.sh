# Stop 53: under a 70% MPS share, `generate` of three prompts (one of about 360 tokens) eagerly returned NaN rows
# (token 0 throughout) and graphed other tokens than uncapped: which setting changes that. Carry .gpu-deps.
source docs/gpu_runs/stop48_mps_client.sh
g3() {  # NAME [flags...]: three prompts, greedy, as an MPS client at SHARE% (default 70), PATCH run first
  local name=$1; shift
  CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${SHARE:-70} timeout 100 python -c "
import sys
${PATCH:-}
from scripts.cli import main
sys.exit(main(['generate', '--model', '/tmp/q06', '--device', 'cuda', '--gpu-memory-utilization', '0.3',
               '--prompt', 'hello there', '--prompt', 'a longer prompt ' * 20,
               '--prompt', 'the same words again and again ' * 60,
               '--max-tokens', '6', '--ignore-eos', '--json'] + sys.argv[1:]))" "$@" > $KEEP/g3-$name.log 2>&1
  echo "$name: rc=$? $(grep -E '^\{' $KEEP/g3-$name.log | sed 's/.*token_ids/ids/' | tr '\n' ' ' | cut -c1-240)"
}
[ -n "${G3_ONLY:-}" ] && return 0
mps_start
SHARE=100 g3 s100-eager --enforce-eager
g3 s70-eager --enforce-eager
PDCLUSTER_PDL=0 g3 s70-eager-nopdl --enforce-eager
g3 s70-eager-torch-attn --enforce-eager --attention-backend torch
for off in splitk fused gemv; do
  PATCH="from common.engine.layers import fusion; fusion._loaded['$off'] = None" g3 s70-eager-off-$off --enforce-eager
done
mps_quit
