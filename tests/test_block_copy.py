"""The block-copy kernel (kvtransfer/block_copy.py): blocks land exactly where their ids say, nothing else
changes. Without a GPU it runs in Triton's interpreter on CPU; across two GPUs on the GPU host."""
from __future__ import annotations

import random

import pytest
import torch

from tests.triton_interp import INTERPRETED, device, interpreter_suite  # noqa: F401 (device: a fixture)

block_copy = pytest.importorskip("kvtransfer.block_copy")

test_interpreter_suite = interpreter_suite(__file__, timeout=600)


def pool(num_blocks: int, block_shape: tuple, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.randn(num_blocks, *block_shape).to(dtype).to(device)


# (block shape, dtype): a block of int64 words; one of a size no wider word divides (int16 words);
# one bigger than a program's share (several programs per block, the last one partial).
SHAPES = [((2, 2, 4, 2, 8), torch.float32), ((1, 1, 3, 1, 3), torch.bfloat16), ((3, 2, 16, 4, 64), torch.float16)]


@pytest.mark.parametrize("shape,dtype", SHAPES, ids=["words", "odd", "multi-program"])
def test_blocks_land_in_their_ids_and_nothing_else_changes(device, shape, dtype):
    rng = random.Random(0)
    src, dst = pool(40, shape, dtype, device), pool(50, shape, dtype, device)
    before = dst.clone()
    src_ids, dst_ids = rng.sample(range(40), 17), rng.sample(range(50), 17)
    block_copy.copy_blocks(src, dst, torch.tensor(src_ids, device=device), torch.tensor(dst_ids, device=device))
    want = before.clone()
    want[dst_ids] = src[src_ids]
    assert torch.equal(dst.cpu(), want.cpu())
    untouched = [i for i in range(50) if i not in dst_ids]
    assert torch.equal(dst[untouched].cpu(), before[untouched].cpu())


def test_int32_ids_and_no_ids(device):
    src, dst = pool(8, (2, 4), torch.float32, device), pool(8, (2, 4), torch.float32, device)
    before = dst.clone()
    block_copy.copy_blocks(src, dst, torch.tensor([], dtype=torch.int32, device=device),
                           torch.tensor([], dtype=torch.int32, device=device))
    assert torch.equal(dst, before)
    block_copy.copy_blocks(src, dst, torch.tensor([7, 0], dtype=torch.int32, device=device),
                           torch.tensor([1, 6], dtype=torch.int32, device=device))
    assert torch.equal(dst[1], src[7]) and torch.equal(dst[6], src[0]) and torch.equal(dst[2:6], before[2:6])


def test_refuses_mismatched_pools_and_ids(device):
    src = pool(4, (2, 4), torch.float32, device)
    ids = torch.tensor([0, 1], device=device)
    with pytest.raises(ValueError, match="blocks differ"):
        block_copy.copy_blocks(src, pool(4, (2, 5), torch.float32, device), ids, ids)
    with pytest.raises(ValueError, match="blocks differ"):
        block_copy.copy_blocks(src, pool(4, (2, 4), torch.float16, device), ids, ids)
    with pytest.raises(ValueError, match="contiguous"):
        block_copy.copy_blocks(src, pool(4, (4, 2), torch.float32, device).transpose(1, 2), ids, ids)
    with pytest.raises(ValueError, match="equally many"):
        block_copy.copy_blocks(src, pool(4, (2, 4), torch.float32, device), ids, ids[:1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_across_two_gpus_the_destination_gpu_reads_the_peer_pool():
    from kvtransfer.cuda_ipc import enable_peer_access

    enable_peer_access(0, 1)
    rng = random.Random(1)
    src, dst = pool(64, (4, 2, 16, 8, 128), torch.bfloat16, "cuda:0"), pool(64, (4, 2, 16, 8, 128), torch.bfloat16,
                                                                            "cuda:1")
    before = dst.cpu()
    src_ids, dst_ids = rng.sample(range(64), 40), rng.sample(range(64), 40)
    block_copy.copy_blocks(src, dst, torch.tensor(src_ids, device="cuda:1"), torch.tensor(dst_ids, device="cuda:1"))
    torch.cuda.synchronize(1)
    want = before.clone()
    want[dst_ids] = src[src_ids].cpu()
    assert torch.equal(dst.cpu(), want)
