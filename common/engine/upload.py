"""A step's host inputs on the device in one copy.

A launch sends a few small host tensors: the step's payload, the rows of its still-pending input tokens, the
sampling settings. Each host -> device copy costs the host tens of microseconds (pinning, switching streams),
and at small batches the host's launch work is as long as the GPU's step; packed into one pinned buffer they
cost one copy.
"""
from __future__ import annotations

import torch

ALIGN = 16  # bytes: every tensor starts where a view of any dtype may (and a Triton kernel sees it aligned)


def upload(hosts: list[torch.Tensor], device: torch.device, stream: torch.cuda.Stream | None = None
           ) -> list[torch.Tensor]:
    """`hosts` on `device`, in order, with their dtypes and shapes: views into one buffer copied without waiting
    (pinned, on `stream`, ordered before the current stream's next use). Off CUDA: views of the packed host
    buffer, so that both paths run the same packing."""
    offsets, total = [], 0
    for t in hosts:
        offsets.append(total)
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    buf = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    raw = buf.numpy()
    for t, at in zip(hosts, offsets):
        flat = t.reshape(-1).view(torch.uint8)
        raw[at:at + flat.numel()] = flat.numpy()
    dev = _to_device(buf, device, stream)
    return [dev[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape) for t, at in zip(hosts, offsets)]


def _to_device(buf: torch.Tensor, device: torch.device, stream: torch.cuda.Stream | None) -> torch.Tensor:
    if device.type != "cuda":
        return buf
    if stream is None:
        return buf.to(device, non_blocking=True)
    compute = torch.cuda.current_stream(device)
    with torch.cuda.stream(stream):  # allocated on the copy stream: no compute-stream block is reused unordered
        dev = buf.to(device, non_blocking=True)
    compute.wait_stream(stream)
    dev.record_stream(compute)
    return dev
