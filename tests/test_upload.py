import pytest
import torch

from common.engine.upload import ALIGN, upload


def test_tensors_of_mixed_dtypes_and_shapes_come_back_equal_and_aligned():
    hosts = [torch.arange(7, dtype=torch.int64), torch.tensor([[1, 2, 3], [4, 5, 6]]),
             torch.tensor([0.5, 1.25, 3.0], dtype=torch.float32), torch.zeros(0, dtype=torch.int64),
             torch.tensor([2**40 + 3]), torch.tensor([-1.5], dtype=torch.float32)]
    out = upload(hosts, torch.device("cpu"))
    assert len(out) == len(hosts)
    base = out[0].untyped_storage().data_ptr()
    for host, dev in zip(hosts, out):
        assert dev.dtype == host.dtype and dev.shape == host.shape
        assert torch.equal(dev, host)
        assert (dev.data_ptr() - base) % ALIGN == 0
        assert dev.untyped_storage().data_ptr() == base  # one buffer: one copy


def test_a_non_contiguous_host_tensor_is_packed_by_value():
    t = torch.arange(12).view(3, 4).t()
    (dev,) = upload([t], torch.device("cpu"))
    assert torch.equal(dev, t)


def test_views_are_writable_without_touching_their_neighbours():
    a, b = upload([torch.zeros(3, dtype=torch.int64), torch.ones(2, dtype=torch.int64)], torch.device("cpu"))
    a[torch.tensor([0, 2])] = torch.tensor([7, 9])
    assert a.tolist() == [7, 0, 9] and b.tolist() == [1, 1]


def test_an_upload_keeps_its_values_when_the_next_step_uploads() -> None:
    """Each launch packs its inputs into a buffer of its own: a staging buffer refilled for step N+1 while the copy of
    step N may still be in flight would hand step N the next step's inputs (PITFALLS: reused pinned host buffers)."""
    cpu = torch.device("cpu")
    first = upload([torch.arange(6), torch.tensor([0.5, 1.5], dtype=torch.float32)], cpu)
    expected = [t.clone() for t in first]
    upload([torch.full((6,), -1), torch.tensor([9.0, 9.0], dtype=torch.float32)], cpu)
    assert all(torch.equal(t, e) for t, e in zip(first, expected))


@pytest.mark.gpu
def test_upload_to_the_gpu_on_a_copy_stream():
    hosts = [torch.arange(5), torch.tensor([0.25, 4.0], dtype=torch.float32)]
    out = upload(hosts, torch.device("cuda"), torch.cuda.Stream())
    assert [t.device.type for t in out] == ["cuda", "cuda"]
    assert [d.cpu().tolist() for d in out] == [h.tolist() for h in hosts]
