"""What the GPU benchmark scripts share: their output, their clocks, and the rates their figures are read against.

Rates are GB/s (1e9 bytes a second). Two are measured here, from the same timing of one large ``copy_``:
- ``copy_bandwidth(src, dst)``: payload bytes a second, each byte copied counted once. A transfer's
  "% of copy rate" is against the copy of the same path (bench_transfer, probe_links).
- ``hbm_bandwidth(device)``: memory traffic of a copy within one GPU, bytes read + bytes written a second
  (twice its payload rate): the roofline of memory-bound work, a decode step reading weights and KV
  (bench_engine) or an attention kernel reading KV (bench_attention).

Importing this module needs neither torch nor triton: the functions that touch a device import them.
"""
from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

# Dense bf16 tensor-core peak (TFLOP/s) of the cards we run on; MFU is measured against it.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
COPY_BYTES = 1 << 30
COPIES_PER_SAMPLE = 8  # a sample long enough that synchronising around it costs well under 1%


def log(line: str = "") -> None:
    """A figure (or a line of a table) on stdout, at once."""
    print(line, flush=True)


def require_gpus(prog: str, count: int = 1, why: str = "") -> None:
    """Exit with status 2 and one line on stderr unless torch sees ``count`` CUDA GPUs."""
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < count:
        print(f"{prog}: needs {count} CUDA GPU{'s' if count > 1 else ''}{why}; torch sees {seen}", file=sys.stderr)
        raise SystemExit(2)


def device_summary() -> str:
    """One line: GPU name and count, SMs, torch and NCCL versions."""
    import torch

    props = torch.cuda.get_device_properties(0)
    nccl = torch.cuda.nccl.version()
    nccl = nccl if isinstance(nccl, int) else ".".join(map(str, nccl))
    return (f"{props.name} x{torch.cuda.device_count()}, {props.multi_processor_count} SMs, torch {torch.__version__}, "
            f"NCCL {nccl}")


def synchronize(devices: Sequence[Any] = ()) -> None:
    """Wait for the CUDA work queued on each device (none given: the current one); CPU devices need no wait."""
    import torch

    if not devices:
        torch.cuda.synchronize()
    for d in devices:
        if torch.device(d).type == "cuda":
            torch.cuda.synchronize(d)


def sync_time(devices: Sequence[Any] = ()) -> float:
    """perf_counter once the devices' queued work is done."""
    synchronize(devices)
    return time.perf_counter()


def median_seconds(fn: Callable[[], object], devices: Sequence[Any] = (), iters: int = 10, warmup: int = 3,
                   reps: int = 1) -> float:
    """Median wall seconds of one ``fn()`` over ``iters`` samples of ``reps`` calls each, after ``warmup``
    samples, synchronising ``devices`` around each sample."""
    times = []
    for i in range(warmup + iters):
        start = sync_time(devices)
        for _ in range(reps):
            fn()
        elapsed = sync_time(devices) - start
        if i >= warmup:
            times.append(elapsed / reps)
    return statistics.median(times)


def bench_ms(fn: Callable[[], object], **kwargs: Any) -> float:
    """Median ms of ``fn`` by triton's do_bench (CUDA events, L2 flushed between runs): for single kernels."""
    from triton.testing import do_bench

    return do_bench(fn, return_mode="median", **kwargs)


def graph_us(fn: Callable[[], object], reps: int = 30, warmup: int = 3) -> float:
    """Microseconds a call of ``fn`` takes replayed from a CUDA graph (CUDA events around ``reps`` replays, after
    one eager call and ``warmup`` replays): for chains of kernels too short to time one by one."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def copy_bandwidth(src: Any = "cuda", dst: Any = None, nbytes: int = COPY_BYTES) -> float:
    """Payload GB/s of ``copy_`` of one ``nbytes`` buffer from ``src`` to ``dst`` (default: within ``src``):
    bytes copied a second, each byte counted once (not read + written)."""
    import torch

    dst = src if dst is None else dst
    a = torch.empty(nbytes, dtype=torch.uint8, device=src)
    b = torch.empty(nbytes, dtype=torch.uint8, device=dst)
    seconds = median_seconds(lambda: b.copy_(a), devices=(a.device, b.device), reps=COPIES_PER_SAMPLE)
    return nbytes / seconds / 1e9


def hbm_bandwidth(device: Any = "cuda", nbytes: int = COPY_BYTES) -> float:
    """GB/s of memory traffic of a copy within one GPU, bytes read + bytes written (2 x its payload rate): the
    practical roofline of memory-bound kernels."""
    return 2 * copy_bandwidth(device, device, nbytes)


def peak_tflops() -> float:
    """Dense bf16 peak of this GPU (NaN for a card not in PEAK_TFLOPS)."""
    import torch

    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_TFLOPS.items() if k in name), float("nan"))


def cuda_kernels(prof: Any) -> list[Any]:
    """A torch.profiler run's CUDA events (kernels, copies), longest total self time first."""
    import torch

    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(events, key=lambda e: -e.self_device_time_total)
