"""The shapes CUDA-graph capture is planned with (PITFALLS: block-table width, eager fallback); the
capture itself runs in tests/test_gpu_engine.py on a GPU."""
from __future__ import annotations

import pytest

from common.engine.block_manager import BlockManager
from common.engine.cuda_graph import block_table_width, graph_batch_sizes
from common.sampling_params import SamplingParams
from common.engine.sequence import Sequence


@pytest.mark.parametrize("max_model_len, block_size", [(64, 16), (65, 16), (4096, 256), (40960, 16)])
def test_block_table_holds_a_full_length_prompt_plus_its_decoded_token(max_model_len, block_size):
    bm = BlockManager(4 * max_model_len // block_size + 8, block_size, enable_prefix_caching=False)
    seq = Sequence("r", list(range(max_model_len)), SamplingParams())
    assert bm.allocate(seq, max_model_len, use_cache=False)
    seq.token_ids.append(0)  # its first decoded token needs a slot too
    assert bm.allocate(seq, max_model_len + 1, use_cache=False)
    assert len(seq.block_table) <= block_table_width(max_model_len, block_size)


@pytest.mark.parametrize("max_num_seqs", [1, 7, 16, 100, 256, 512])
def test_batch_buckets_cover_every_batch_up_to_max_num_seqs(max_num_seqs):
    sizes = graph_batch_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes)) and sizes[-1] == max_num_seqs
    for b in range(1, max_num_seqs + 1):  # each batch replays the smallest bucket that holds it
        assert any(s >= b for s in sizes)
    assert sizes[0] == 1


def test_batches_past_the_largest_bucket_are_left_to_eager():
    sizes = graph_batch_sizes(1000)  # more than the largest bucket captured
    assert sizes[-1] < 1000  # ModelRunner.execute runs such batches eagerly (num_decodes > max_batch_size)
