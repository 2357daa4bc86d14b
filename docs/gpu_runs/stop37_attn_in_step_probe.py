"""Stop 37 (issue 20): what decode attention costs inside the batch-64 step, against its cost alone (stop 26's probe:
1,777 us a step at 4.23 TB/s; the profiler reads 1,907-1,946 us in the step, but a kernel launched with PDL is timed
from its early start, so the two do not compare). Here the step itself, alternated in one process:

- `engine`: as it is;
- `noattn`: the decode attention kernel not launched (its output left as is; only the step's time counts): the
  step less this is what attention costs in it;
- `nopdl`: the decode attention kernel launched without PDL (the kernels around it as they are).

Run: python docs/gpu_runs/stop37_attn_in_step_probe.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from scripts.bench_engine import decode_step_ms, make_llm, model_dir, weight_bytes  # noqa: E402
from scripts.bench_gpu import hbm_bandwidth  # noqa: E402
from common.engine.attention import triton_ops  # noqa: E402

REAL_DECODE, REAL_KWARGS = triton_ops.paged_decode_attention, triton_ops.launch_kwargs


def no_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, out=None, plan=None, **kw):
    return torch.empty_like(q) if out is None else out


def set_mode(mode: str) -> None:
    """Before the engine is made: its backend takes the module's function then (attention/choice.py)."""
    triton_ops.launch_kwargs = (lambda device: {"PDL": False}) if mode == "nopdl" else REAL_KWARGS
    triton_ops.paged_decode_attention = no_attention if mode == "noattn" else REAL_DECODE


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    with tempfile.TemporaryDirectory() as d:
        path = model_dir("qwen3-0.6b", Path(d))
        bw = hbm_bandwidth()
        for mode in ("engine", "noattn", "nopdl", "engine", "noattn", "nopdl"):
            set_mode(mode)
            llm = make_llm(path, max_num_seqs=256, max_model_len=1024 + 300)
            try:
                layout = llm.engine.runner.layout
                kv = layout.block_bytes // layout.block_size
                wb = weight_bytes(llm)
                for batch in (64,):
                    ms = decode_step_ms(llm, batch, 1024)
                    roof = (wb + batch * (1024 + 20) * kv) / (bw * 1e9) * 1e3
                    print(f"decode {mode:7s} batch {batch:3d}: {ms:.3f} ms, {ms / roof:.2f}x the roofline "
                          f"({roof:.3f} ms)", flush=True)
            finally:
                llm.close()
    set_mode("engine")


if __name__ == "__main__":
    main()
