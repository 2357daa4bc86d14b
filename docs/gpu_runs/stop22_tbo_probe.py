"""Probe: the decode kernel's launch (keys a tile, warps, pipeline stages) patched for every attention call, then
`bench_engine` with the rest of the arguments. Whether a leaner attention leaves room on the SMs for the other
half's GEMMs in a two-batch step. Usage: python docs/gpu_runs/stop22_tbo_probe.py BLOCK_N WARPS STAGES ARGS..."""
import sys

from common.engine.attention import triton_ops
from scripts import bench_engine

block_n, warps, stages = (int(a) for a in sys.argv[1:4])
triton_ops.decode_launch = lambda dtype: triton_ops.DecodeLaunch(block_n, warps, stages)
print(f"decode launch patched: {triton_ops.decode_launch(None)}", flush=True)
bench_engine.main(sys.argv[4:])
