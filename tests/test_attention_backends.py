"""The attention backends' side of a step on CPU: the metadata each builds from a step's AttentionInputs, the
triton backend's decode plan, and the CUDA-graph buffers it fills before a replay (padding rows inert, the
plan made for the graph's bucket). The Triton kernels themselves are tested in test_triton_ops.py; here the
triton backend runs the torch kernels, so nothing below needs a GPU or triton."""
from __future__ import annotations

import pytest
import torch

from common.engine.attention.decode_plan import PLAN_ROWS, plan_capacity, plan_table
from common.engine.attention.metadata import AttentionInputs
from common.engine.attention.torch_backend import TORCH_OPS, TorchBackend
from common.engine.attention.triton_backend import SPLIT, WHOLE, TritonBackend
from common.engine.cuda_graph import block_table_width

CPU = torch.device("cpu")
KV_HEADS = 2


def triton_backend() -> TritonBackend:
    return TritonBackend(TORCH_OPS, KV_HEADS, CPU)


def decode_step(lens: list[int], width: int = 3, plan=None, first_block: int = 1) -> AttentionInputs:
    b = len(lens)
    tables = torch.arange(first_block, first_block + b * width, dtype=torch.int64).view(b, width)
    flat = torch.zeros(0, dtype=torch.int64) if plan is None else torch.from_numpy(plan).ravel()
    return AttentionInputs(
        num_decodes=b, slot_mapping=torch.arange(100, 100 + b, dtype=torch.int64),
        query_start_loc=torch.arange(b + 1, dtype=torch.int64), seq_lens=torch.tensor(lens, dtype=torch.int64),
        block_tables=tables, max_query_len=1, max_seq_len=max(lens), prefix_cached=False,
        max_prefill_query_len=0, plan=flat)


def test_metadata_of_a_mixed_step():
    """int32 where the kernels want it, the prefill part rebased to start at 0, no plan on the torch backend."""
    step = AttentionInputs(
        num_decodes=2, slot_mapping=torch.arange(7), query_start_loc=torch.tensor([0, 1, 2, 5, 7]),
        seq_lens=torch.tensor([9, 4, 3, 12]), block_tables=torch.arange(8).view(4, 2), max_query_len=3,
        max_seq_len=12, prefix_cached=True, max_prefill_query_len=3, plan=torch.zeros(0, dtype=torch.int64))
    md = TorchBackend().prepare_metadata(step)
    assert (md.num_decodes, md.num_decode_tokens, md.num_prefills) == (2, 2, 2)
    assert md.query_start_loc.dtype == md.seq_lens.dtype == md.block_tables.dtype == torch.int32
    assert md.slot_mapping.dtype == torch.int64
    assert md.prefill_query_start_loc.tolist() == [0, 3, 5] and md.prefill_query_start_loc.dtype == torch.int32
    assert (md.max_query_len, md.max_seq_len, md.prefix_cached, md.max_prefill_query_len) == (3, 12, True, 3)
    assert md.decode_plan is None
    assert not TorchBackend.supports_graphs and TorchBackend().plan_step([4000, 1], 1) is None
    with pytest.raises(NotImplementedError):
        TorchBackend().init_graph_buffers(4, 3, 40)


def test_triton_metadata_always_carries_a_plan():
    """No table: an unsplit plan (the kernel would otherwise plan from seq_lens, syncing the device)."""
    backend = triton_backend()
    md = backend.prepare_metadata(decode_step([3, 5]))
    assert md.decode_plan is not None and not md.decode_plan.split and md.prefill_query_start_loc is None
    lens = [4000, 3]
    table = backend.plan_step(lens, len(lens))
    assert table is not None and table.shape == (PLAN_ROWS, plan_capacity(2, KV_HEADS, CPU))
    md = backend.prepare_metadata(decode_step(lens, plan=table))
    assert md.decode_plan.split and md.decode_plan.units.dtype == torch.int32
    assert torch.equal(md.decode_plan.units, torch.from_numpy(table).int())
    assert backend.plan_step([], 4) is None


def test_graph_metadata_views_the_static_buffers():
    backend = triton_backend()
    width = block_table_width(64, 16)
    backend.init_graph_buffers(16, width, 64)
    buf = backend.buffers
    assert buf.block_tables.shape == (16, width) and (buf.slot_mapping == -1).all() and (buf.seq_lens == 0).all()
    assert backend.graph_variants(8) == (SPLIT, WHOLE)
    split, whole = backend.graph_metadata(8, SPLIT), backend.graph_metadata(8, WHOLE)
    for md in (split, whole):
        assert md.seq_lens.data_ptr() == buf.seq_lens.data_ptr() and md.seq_lens.shape == (8,)
        assert md.block_tables.shape == (8, width) and md.slot_mapping.shape == (8,)
        assert md.query_start_loc.tolist() == list(range(9)) and md.num_decodes == 8 and md.num_prefills == 0
    assert split.decode_plan.split and split.decode_plan.units.shape == (PLAN_ROWS, plan_capacity(8, KV_HEADS, CPU))
    assert split.decode_plan.units.data_ptr() == buf.plan.data_ptr() and (buf.plan[0] == -1).all()
    assert not whole.decode_plan.split and whole.decode_plan.units is None


def test_fill_copies_the_step_and_keeps_padding_rows_inert():
    """Padding rows store nothing (slot -1) and attend to nothing (seq_len 0), also after a larger batch left
    its values there."""
    backend = triton_backend()
    backend.init_graph_buffers(16, 5, 64)
    buf = backend.buffers

    def padded(b: int) -> bool:
        return bool((buf.slot_mapping[b:] == -1).all() and (buf.seq_lens[b:] == 0).all())
    for lens, bucket in [([7] * 5, 8), ([9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19], 16), ([3, 4], 2), ([5], 1),
                         ([6, 6, 6], 4)]:
        step = decode_step(lens, width=3 if len(lens) != 2 else 5, first_block=len(lens))
        assert backend.graph_variant(step) == WHOLE
        backend.fill_graph_buffers(step, bucket)
        b = len(lens)
        assert buf.seq_lens[:b].tolist() == lens and buf.slot_mapping[:b].tolist() == step.slot_mapping.tolist()
        assert torch.equal(buf.block_tables[:b, :step.block_tables.shape[1]], step.block_tables.int())
        assert padded(b), (lens, buf.slot_mapping, buf.seq_lens)


def test_fill_takes_a_plan_made_for_the_graphs_bucket_only():
    backend = triton_backend()
    backend.init_graph_buffers(16, 4, 64)
    lens = [4000, 3, 70]
    table = plan_table(lens, KV_HEADS, CPU, batch=4)  # planned for the bucket of 4
    step = decode_step(lens, plan=table)
    assert backend.graph_variant(step) == SPLIT
    backend.fill_graph_buffers(step, 4)
    units = plan_capacity(4, KV_HEADS, CPU)
    assert torch.equal(backend.buffers.plan[:, :units], torch.from_numpy(table).int())
    assert backend.buffers.plan[4, 3] == 0  # the padding sequence has no units
    with pytest.raises(AssertionError, match="for a graph of batch 8"):
        backend.fill_graph_buffers(step, 8)
