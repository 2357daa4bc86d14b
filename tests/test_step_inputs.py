"""A step's inputs as rank 0 packs them and every tensor-parallel rank unpacks them (common/engine/step_inputs.py):
the typed header round-trips and sizes the payload, and the payload's views hold what the scheduler asked for."""
from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from common.engine.scheduler import ScheduledBatch
from common.engine.sequence import PENDING, Sequence
from common.engine.step_inputs import (HEADER_SIZE, STOP, PendingRows, StepHeader, pack_step, split_step, unpack_step,
                                       warmup_step)
from common.sampling_params import SamplingParams

BLOCK = 4


def seq(tokens: list[int], computed: int, blocks: list[int], ref: tuple[int, int] = (-1, -1)) -> Sequence:
    s = Sequence(f"r{len(tokens)}-{computed}", tokens, SamplingParams())
    s.num_computed_tokens, s.block_table, s.sample_ref = computed, blocks, ref
    return s


def no_plan(lens: list[int], decode_only: bool) -> None:
    return None


def test_header_round_trips_and_sizes_the_payload():
    header = StepHeader(num_tokens=7, num_seqs=3, table_width=5, num_decodes=2, max_query_len=5, max_seq_len=300,
                        prefix_cached=True, max_prefill_query_len=5, plan_size=40)
    packed = header.pack()
    assert packed.dtype == torch.int64 and packed.shape == (HEADER_SIZE,) and HEADER_SIZE == len(fields(StepHeader))
    assert StepHeader.unpack(packed) == header
    assert isinstance(StepHeader.unpack(packed).prefix_cached, bool)
    assert header.sections() == [7, 7, 7, 4, 3, 15, 3, 40]
    assert header.payload_size == 8 + 8 + 8 + 4 + 4 + 16 + 4 + 40  # each section padded to an even count
    assert StepHeader.unpack(STOP.pack()).stop and not StepHeader.unpack(packed).stop


def test_pack_then_unpack_gives_the_scheduled_step():
    """Decodes first (one with a PENDING input from the last launch), then a prefill chunk over a cached prefix."""
    d0 = seq([5, 6, 7, 8, 9], 4, [3, 8])  # decodes token 9 at position 4: block 8, offset 0
    d1 = seq([1, 2, PENDING], 2, [6], ref=(7, 1))  # its input is row 1 of launch 7's tokens
    p = seq(list(range(20, 30)), 4, [2, 9, 4])  # positions 4..9 of a 10-token prompt, 4 cached
    batch = ScheduledBatch([d0, d1, p], [1, 1, 6])
    seen = []

    def plan(lens, decode_only):
        seen.append((lens, decode_only))
        return np.arange(10, dtype=np.int64).reshape(5, 2)
    step = pack_step(batch, BLOCK, launch=7, plan=plan)
    assert seen == [([5, 3], False)]
    h = step.header
    assert (h.num_tokens, h.num_seqs, h.table_width, h.num_decodes) == (8, 3, 3, 2)
    assert (h.max_query_len, h.max_seq_len, h.prefix_cached, h.max_prefill_query_len, h.plan_size) == \
        (6, 10, True, 6, 10)
    assert step.payload.dtype == torch.int64 and step.payload.shape == (h.payload_size,)
    assert step.pending.tensor().tolist() == [[1], [1]] and step.pending.run() == (1, 1, 1)  # index 1 takes row 1
    inputs = unpack_step(h, step.payload)
    attn = inputs.attn
    assert inputs.input_ids.tolist() == [9, PENDING] + list(range(24, 30))
    assert inputs.positions.tolist() == [4, 2, 4, 5, 6, 7, 8, 9]
    assert attn.slot_mapping.tolist() == [8 * 4, 6 * 4 + 2, 9 * 4, 9 * 4 + 1, 9 * 4 + 2, 9 * 4 + 3, 4 * 4, 4 * 4 + 1]
    assert attn.query_start_loc.tolist() == [0, 1, 2, 8] and attn.seq_lens.tolist() == [5, 3, 10]
    assert attn.block_tables.tolist() == [[3, 8, 0], [6, 0, 0], [2, 9, 4]]
    assert inputs.logits_indices.tolist() == [0, 1, 7]
    assert attn.plan.tolist() == list(range(10))
    assert (attn.num_decodes, attn.num_seqs, attn.decode_only, attn.prefix_cached) == (2, 3, False, True)


def test_a_one_token_row_after_a_prompt_chunk_keeps_its_place():
    """A prompt whose last token is computed alone (a chunk of one) after another prompt's chunk: the one-token rows
    and the chunks' tokens go in as scheduled, whichever way each is packed."""
    d = seq([5, 6, PENDING], 2, [1], ref=(3, 4))  # a decode whose input is row 4 of launch 3's tokens
    p = seq(list(range(40, 49)), 0, [5, 7, 2])  # a whole 9-token prompt
    q = seq(list(range(60, 65)), 4, [9, 6])  # the last of a 5-token prompt, alone: position 4, block 6, offset 0
    step = pack_step(ScheduledBatch([d, p, q], [1, 9, 1]), BLOCK, launch=3, plan=no_plan)
    assert (step.header.num_tokens, step.header.num_decodes) == (11, 1)
    inputs = unpack_step(step.header, step.payload)
    assert inputs.input_ids.tolist() == [PENDING] + list(range(40, 49)) + [64]
    assert inputs.positions.tolist() == [2] + list(range(9)) + [4]
    assert inputs.attn.slot_mapping.tolist() == [4 + 2, 20, 21, 22, 23, 28, 29, 30, 31, 8, 24]
    assert inputs.attn.query_start_loc.tolist() == [0, 1, 10, 11] and inputs.logits_indices.tolist() == [0, 9, 10]
    assert step.pending.tensor().tolist() == [[0], [4]]


def test_a_pending_input_from_another_launch_is_refused():
    batch = ScheduledBatch([seq([1, 2, PENDING], 2, [6], ref=(6, 0))], [1])
    with pytest.raises(AssertionError, match="not from the last step"):
        pack_step(batch, BLOCK, launch=7, plan=no_plan)


def test_decode_only_step_and_no_plan():
    batch = ScheduledBatch([seq([1, 2, 3], 2, [6]), seq([4, 5], 1, [1])], [1, 1])
    step = pack_step(batch, BLOCK, launch=0, plan=lambda lens, decode_only: None if decode_only else 1 / 0)
    assert step.pending is None and step.header.plan_size == 0 and not step.header.prefix_cached
    inputs = unpack_step(step.header, step.payload)
    assert inputs.attn.decode_only and inputs.attn.plan.numel() == 0


def test_prefill_only_step_asks_for_no_plan():
    batch = ScheduledBatch([seq([1, 2, 3], 0, [6])], [3])
    step = pack_step(batch, BLOCK, launch=0, plan=lambda lens, decode_only: 1 / 0)
    assert step.header.num_decodes == 0 and not step.header.prefix_cached


def test_warmup_step_stores_nothing_and_reads_no_cache():
    step = warmup_step([5, 3])
    h = step.header
    assert step.payload.shape == (h.payload_size,) and step.pending is None
    inputs = unpack_step(h, step.payload)
    assert (inputs.attn.slot_mapping == -1).all() and inputs.attn.block_tables.shape == (2, 0)
    assert not h.prefix_cached and h.num_decodes == 0 and inputs.logits_indices.tolist() == [4, 7]
    assert inputs.positions.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 8, 13])
def test_every_section_starts_16_byte_aligned_whatever_the_step_sizes(num_tokens):
    """A Triton kernel specializes on its pointers' alignment: a view's must not depend on odd token or sequence
    counts, or such a step compiles a variant warm-up never ran (common/engine/warmup.py)."""
    prompt = seq(list(range(1, num_tokens + 1)), 0, [1, 2, 3, 4])
    decode = seq([5, 6, 7], 2, [6])
    step = pack_step(ScheduledBatch([decode, prompt], [1, num_tokens]), BLOCK, launch=0,
                     plan=lambda lens, decode_only: np.arange(5, dtype=np.int64).reshape(5, 1))
    inputs = unpack_step(step.header, step.payload)
    attn = inputs.attn
    views = [inputs.input_ids, inputs.positions, attn.slot_mapping, attn.query_start_loc, attn.seq_lens,
             attn.block_tables, inputs.logits_indices, attn.plan]
    base = step.payload.data_ptr()
    assert all((v.data_ptr() - base) % 16 == 0 for v in views)
    assert inputs.positions.tolist() == [2] + list(range(num_tokens))
    assert inputs.logits_indices.tolist() == [0, num_tokens]


def test_padded_step_sizes_are_few_and_never_past_the_budget():
    from common.engine.step_sizes import padded_tokens, token_buckets

    assert [padded_tokens(n, 8192) for n in (1, 64, 65, 512, 513, 4096, 4097, 8192)] == \
        [64, 64, 128, 512, 768, 4096, 5120, 8192]
    assert padded_tokens(7000, 7000) == 7000 and padded_tokens(6500, 7000) == 7000
    buckets = token_buckets(8192)
    assert len(buckets) == 26 and buckets[-1] == 8192
    assert all(padded_tokens(n, 8192) in buckets for n in range(1, 8193))


def test_a_padded_step_adds_tokens_no_sequence_owns_and_that_store_nothing():
    from common.engine.step_sizes import padded_tokens

    decode = seq([5, 6, 7], 2, [6])
    prompt = seq(list(range(1, 11)), 0, [1, 2, 3])
    batch = ScheduledBatch([decode, prompt], [1, 10])
    plain = unpack_step(*(lambda s: (s.header, s.payload))(pack_step(batch, BLOCK, 0, no_plan)))
    step = pack_step(batch, BLOCK, 0, no_plan, pad=lambda n, decodes: padded_tokens(n, 8192))
    inputs = unpack_step(step.header, step.payload)
    assert step.header.num_tokens == 64 and inputs.input_ids.shape == (64,)
    assert inputs.input_ids[:11].tolist() == plain.input_ids.tolist() and inputs.input_ids[11:].eq(0).all()
    assert inputs.attn.slot_mapping[11:].eq(-1).all() and inputs.positions[11:].eq(0).all()
    assert inputs.attn.query_start_loc.tolist() == [0, 1, 11] and inputs.logits_indices.tolist() == [0, 10]
    decode_only = pack_step(ScheduledBatch([decode], [1]), BLOCK, 0, no_plan, pad=lambda n, decodes: 64)
    assert decode_only.header.num_tokens == 1  # decode steps replay graphs sized by batch: no padding


def test_a_mixed_step_splits_into_its_decodes_and_its_prompts_each_indexed_from_zero():
    """What a step whose decodes replay their graph beside eager prompts runs (ModelRunner.execute)."""
    d0 = seq([5, 6, 7, 8, 9], 4, [3, 8])
    d1 = seq([1, 2, 3], 2, [6])
    p0 = seq(list(range(20, 30)), 4, [2, 9, 4])  # 6 new tokens after 4 cached
    p1 = seq([40, 41, 42], 0, [7])
    batch = ScheduledBatch([d0, d1, p0, p1], [1, 1, 6, 3])
    inputs = unpack_step(*(lambda s: (s.header, s.payload))(
        pack_step(batch, BLOCK, 0, lambda lens, decode_only: np.arange(10, dtype=np.int64).reshape(5, 2),
                  pad=lambda n, decodes: decodes + 16)))
    decodes, prompts = split_step(inputs)
    assert decodes.input_ids.tolist() == [9, 3] and decodes.positions.tolist() == [4, 2]
    assert decodes.logits_indices.tolist() == [0, 1]
    d = decodes.attn
    assert d.num_decodes == 2 and d.decode_only and d.max_query_len == 1 and not d.prefix_cached
    assert d.query_start_loc.tolist() == [0, 1, 2] and d.seq_lens.tolist() == [5, 3]
    assert d.slot_mapping.tolist() == [8 * BLOCK, 6 * BLOCK + 2] and d.plan.tolist() == list(range(10))
    assert prompts.input_ids.shape == (16,) and prompts.input_ids[:9].tolist() == list(range(24, 30)) + [40, 41, 42]
    assert prompts.logits_indices.tolist() == [5, 8]  # each prompt's last new token, counted from the prompts' start
    p = prompts.attn
    assert p.num_decodes == 0 and p.query_start_loc.tolist() == [0, 6, 9] and p.seq_lens.tolist() == [10, 3]
    assert p.prefix_cached and p.max_prefill_query_len == 6 and p.plan.numel() == 0
    assert p.slot_mapping[9:].eq(-1).all()  # the padding stays padding
    assert p.block_tables.tolist() == [[2, 9, 4], [7, 0, 0]]


@pytest.mark.parametrize("dst, src, run", [
    ([0, 1, 2], [0, 1, 2], (0, 0, 3)),  # a steady decode batch
    ([2, 3], [5, 6], (2, 5, 2)),
    ([0, 1, 2], [1, 0, 2], None),  # rows reordered
    ([0, 1, 2], [0, 1, 3], None),  # a row gone from the last launch
    ([0, 2], [0, 1], None),  # a prompt between them takes index 1
])
def test_pending_rows_take_one_slice_only_where_both_sides_are_runs(dst, src, run):
    pending = PendingRows(dst, src)
    assert pending.run() == run
    last, payload = torch.arange(100, 110), torch.zeros(8, dtype=torch.int64)
    if run is None:
        d, s = pending.tensor()
        payload[d] = last[s]
    else:
        d, s, n = run
        payload[d:d + n] = last[s:s + n]
    assert [payload[d].item() for d in dst] == [last[s].item() for s in src]
