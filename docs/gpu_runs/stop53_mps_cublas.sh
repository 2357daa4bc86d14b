# Stop 53: the eager NaN rows under a 70% MPS share (stop53_mps_eager.sh) with one setting changed each: the LM head
# by cuBLAS, cuBLAS without workspace, addmm without cuBLASLt, cuBLASLt preferred. Carry .gpu-deps.
G3_ONLY=1 source docs/gpu_runs/stop53_mps_eager.sh
mps_start
PATCH="from common.engine.layers import fusion; fusion._loaded['head_sampler'] = None" g3 s70-eager-off-head --enforce-eager
CUBLAS_WORKSPACE_CONFIG=:0:0 g3 s70-eager-noworkspace --enforce-eager
DISABLE_ADDMM_CUDA_LT=1 g3 s70-eager-nolt --enforce-eager
PATCH="import torch; torch.backends.cuda.preferred_blas_library('cublaslt')" g3 s70-eager-lt --enforce-eager
SHARE=50 g3 s50-eager --enforce-eager
SHARE=90 g3 s90-eager --enforce-eager
mps_quit
