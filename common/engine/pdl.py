"""Programmatic dependent launch (Hopper and later): a kernel launched with it may start while the kernel
before it in the stream still runs, up to its `gdc_wait`, which waits for that kernel to finish and its writes
to land. A decode step of a small batch is a chain of short kernels, each a few microseconds of latency; with
PDL each one's launch, and whatever it can do before reading its input (loading weights), overlaps the one
before.

The rules a kernel launched this way follows: before `gdc_wait` it reads only what no step writes (weights)
and writes nothing; every program reaches `gdc_wait` (no early return before it), so that a kernel never
finishes before the one it depends on. `gdc_launch_dependents` lets the next kernel start.
"""
from __future__ import annotations

import functools
import os

import torch


@functools.cache
def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: a Hopper or later GPU, compiled (not Triton's interpreter)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if os.environ.get("PDCLUSTER_PDL", "1") == "0":  # an escape hatch for A/B runs and driver trouble
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_kwargs(device: torch.device) -> dict:
    """The kernel-call keywords of a PDL launch on `device`, and the kernels' PDL constexpr."""
    return {"launch_pdl": True, "PDL": True} if pdl_enabled(device) else {"PDL": False}
