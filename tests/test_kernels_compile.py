"""Every Triton kernel of the engine compiles for Hopper (sm_90), on a machine without a GPU.

Triton's interpreter (the CPU runs of test_fused.py and test_triton_ops.py) checks what a kernel computes
but never compiles it: a kernel that type-checks only in the interpreter (say, one name bound to tensors
of two shapes in the two branches of a runtime `if`) passes there and fails on every GPU.
"""
from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")
try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
except ImportError:  # an older Triton: the GPU host runs these kernels anyway
    pytest.skip("this Triton cannot compile ahead of time", allow_module_level=True)

from common.engine.attention import triton_ops  # noqa: E402
from common.engine.layers import fused, gemv, head_sampler, splitk  # noqa: E402
from kvtransfer import block_copy  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
# Argument types by name; other pointers are the activations' bf16, other scalars are int32 strides and sizes.
TYPES = {"slot_ptr": "*i64", "pos_ptr": "*i64", "seeds_ptr": "*i64", "best_idx_ptr": "*i64",
         "block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "plan_ptr": "*i32", "query_start_loc_ptr": "*i32",
         "cos_sin_ptr": "*fp32", "temps_ptr": "*fp32", "best_ptr": "*fp32", "part_o_ptr": "*fp32",
         "part_lse_ptr": "*fp32", "eps": "fp32", "qk_scale": "fp32", "src_ptr": "*i64", "dst_addr": "i64",
         "src_ids_ptr": "*i64", "dst_ids_ptr": "*i64", "part_ptr": "*fp32"}
ROPE = dict(NUM_Q_HEADS=16, NUM_KV_HEADS=8, BLOCK_Q=16, BLOCK_KV=8, HEAD_DIM=128, PAGE=16)
CASES = {  # name: (kernel, constexprs[, argument types unlike TYPES])
    "rms_norm": (fused._rms_norm_kernel, dict(N=1024, BLOCK=1024, HAS_RESIDUAL=True, PARTS=0, PDL=True)),
    "rms_norm-576": (fused._rms_norm_kernel, dict(N=576, BLOCK=1024, HAS_RESIDUAL=False, PARTS=0, PDL=False)),
    "rms_norm-parts": (fused._rms_norm_kernel, dict(N=1024, BLOCK=1024, HAS_RESIDUAL=True, PARTS=6, PDL=True),
                       {"x_ptr": "*fp32"}),
    "qk_norm_rope_store": (fused._qk_norm_rope_kernel, dict(ROPE, HAS_NORM=True, STORE=True, PDL=True)),
    "qk_norm_rope": (fused._qk_norm_rope_kernel, dict(ROPE, HAS_NORM=True, STORE=False, PDL=False)),
    "rope_store-smollm2": (fused._qk_norm_rope_kernel, dict(NUM_Q_HEADS=9, NUM_KV_HEADS=3, BLOCK_Q=16, BLOCK_KV=4,
                                                            HEAD_DIM=64, PAGE=256, HAS_NORM=False, STORE=True,
                                                            PDL=True)),
    "gemv-qkv": (gemv._gemv_kernel, dict(N=4096, K=1024, BLOCK_N=8, BLOCK_K=1024, SILU=False, HAS_BIAS=True,
                                         PDL=True)),
    "gemv-down-silu": (gemv._gemv_kernel, dict(N=1024, K=3072, BLOCK_N=2, BLOCK_K=4096, SILU=True, HAS_BIAS=False,
                                               PDL=False)),
    "splitk-o": (splitk._partial_kernel, dict(N=1024, K=2048, ROWS=64, BLOCK_N=64, BLOCK_K=512, PDL=True)),
    "splitk-sum": (splitk._sum_kernel, dict(N=1024, ROWS=64, SPLITS=6, PDL=True)),
    "silu_and_mul": (fused._silu_and_mul_kernel, dict(N=3072, BLOCK=1024, PDL=True)),
    "gumbel_argmax": (fused._gumbel_argmax_kernel, dict(V=151936, SPLIT=6144, BLOCK=2048)),
    "first_best": (fused._first_best_kernel, dict(BLOCK=2048)),
    "head_sample": (head_sampler._head_sample_kernel, dict(V=151936, K=1024, BLOCK_M=64, BLOCK_N=head_sampler.BLOCK_N,
                                                           BLOCK_K=head_sampler.BLOCK_K)),
    "head_sample-smollm2": (head_sampler._head_sample_kernel, dict(V=49152, K=576, BLOCK_M=16,
                                                                   BLOCK_N=head_sampler.BLOCK_N,
                                                                   BLOCK_K=head_sampler.BLOCK_K)),
    "store_kvcache": (triton_ops._store_kvcache_kernel, dict(NUM_HEADS=8, HEAD_DIM=128, BLOCK_H=8, PAGE=16)),
    "decode-split": (triton_ops._decode_kernel, dict(GROUP=2, BLOCK_G=16, HEAD_DIM=128, PAGE=16, BLOCK_N=64,
                                                     DIRECT=False, PRECISION="tf32", PDL=True)),
    "decode-direct": (triton_ops._decode_kernel, dict(GROUP=4, BLOCK_G=16, HEAD_DIM=128, PAGE=256, BLOCK_N=64,
                                                      DIRECT=True, PRECISION="tf32", PDL=False)),
    "decode_reduce": (triton_ops._decode_reduce_kernel, dict(HEAD_DIM=128, BLOCK_S=16, PDL=True)),
    "prefill": (triton_ops._prefill_kernel, dict(GROUP=2, HEAD_DIM=128, PAGE=16, BLOCK_M=128, BLOCK_N=64,
                                                 PRECISION="tf32")),
    "copy_blocks": (block_copy._copy_blocks_kernel, dict(BLOCK=block_copy.WORDS_PER_PROGRAM)),
}
# launched unlike Triton's defaults
OPTIONS = {"splitk-o": dict(num_warps=splitk.PARTIAL_WARPS),
           "head_sample": dict(num_warps=head_sampler.WARPS, num_stages=head_sampler.STAGES)}


@pytest.mark.parametrize("name", list(CASES))
def test_kernel_compiles_for_hopper(name: str) -> None:
    kernel, constexprs, *own_types = CASES[name]
    assert set(constexprs) == {kernel.arg_names[i] for i in kernel.constexprs}, "give every constexpr"
    types = {**TYPES, **(own_types[0] if own_types else {})}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "*bf16" if a.endswith("_ptr") else "i32")
                 for a in kernel.arg_names}
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER,
                              options=OPTIONS.get(name))
    assert compiled.asm["cubin"], f"{name}: no machine code"
