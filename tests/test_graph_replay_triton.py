"""test_cuda_graph_shapes.py's graph-replay scenarios on the triton backend's own kernels, without a GPU: in
Triton's interpreter (a subprocess with TRITON_INTERPRET=1, tests/triton_interp.py), graphs stood in for by
forwards on the metadata they were captured with. The decode kernel reads the split plans through the
buffers' views and the padded rows as a replay leaves them. On a GPU, test_gpu_engine.py runs the same
scenarios with real graphs."""
from __future__ import annotations

import pytest

from tests.test_cuda_graph_shapes import blocks_reused, generate, long_among_short, use_triton_backend, with_graphs
from tests.triton_interp import INTERPRETED, interpreter_suite
from common.engine.attention.backend import AttentionOps
from common.engine.attention.triton_backend import SPLIT
from common.engine.llm import LLM

triton_ops = pytest.importorskip("common.engine.attention.triton_ops")
from common.engine.attention.flash_prefill import varlen_prefill  # noqa: E402

test_interpreter_suite = interpreter_suite(__file__, timeout=600)


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter suite; on a GPU, test_gpu_engine.py")
@pytest.mark.parametrize("scenario", [long_among_short, blocks_reused])
def test_triton_graph_replays_give_the_eager_tokens(tiny_qwen3_dir, monkeypatch, scenario):
    ops = AttentionOps(triton_ops.store_kvcache, triton_ops.paged_decode_attention, varlen_prefill,
                       triton_ops.paged_prefill_attention)
    settings, arrivals = scenario()
    tokens = {}
    for graphs in (False, True):
        llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, enable_prefix_caching=False, **settings)
        try:
            replays = with_graphs(llm, monkeypatch, ops) if graphs else use_triton_backend(llm, ops)
            tokens[graphs] = generate(llm, arrivals)
        finally:
            llm.close()
    assert tokens[True] == tokens[False]
    assert {b for b, _, n in replays if n < b}, "no replay had padding rows"
    if scenario is long_among_short:
        assert any(v == SPLIT for _, v, _ in replays)


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter suite; on a GPU, test_gpu_engine.py")
def test_triton_prefill_graph_replays_give_the_eager_tokens(tiny_qwen3_dir, monkeypatch):
    """The store and paged prefill kernels under a prompt graph's upper bounds: empty sequence slots, a longest
    prompt as long as the bucket, offsets an earlier step left (test_prefill_graph.py's arrivals)."""
    from tests.test_prefill_graph import arrivals, generate as generate_greedy, with_prefill_graphs

    ops = AttentionOps(triton_ops.store_kvcache, triton_ops.paged_decode_attention, varlen_prefill,
                       triton_ops.paged_prefill_attention)
    tokens, replays = {}, []
    for graphs in (False, True):
        llm = LLM(str(tiny_qwen3_dir), device="cpu", max_num_seqs=8, max_num_batched_tokens=256, num_kv_blocks=96)
        try:
            if graphs:
                with_graphs(llm, monkeypatch, ops)
                replays = with_prefill_graphs(llm, monkeypatch, max_tokens=128, max_seqs=4)
            else:
                use_triton_backend(llm, ops)
            tokens[graphs] = generate_greedy(llm, arrivals())
        finally:
            llm.close()
    assert tokens[True] == tokens[False]
    assert {v for _, v, _ in replays} == {"fresh", "cached"}
