"""Stop 42 (issue 20): registers and spills of every Triton kernel variant `tests/test_kernels_compile.py` compiles,
as ptxas reports them for Hopper (sm_90a), on a machine without a GPU. Run it under the Triton of the GPU host (3.6.0
at stop 42: `pip install triton==3.6.0` into a path put ahead of the venv's), since another Triton's compiler
allocates differently. The attention kernels are compiled with the warps and stages the engine launches them with
(`DecodeLaunch`, `_prefill_config` for bf16), the others with Triton's defaults. With `--decode-sweep`, the decode
kernel (Qwen3-0.6B's heads, pages of 16, unsplit and split) over the launch settings `scripts/bench_attention.py
--sweep` tries: keys a tile, warps, stages.

Run: python docs/gpu_runs/stop42_kernel_registers.py [--decode-sweep]
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import torch  # noqa: E402

from common.engine.attention.triton_ops import DecodeLaunch, _prefill_config  # noqa: E402
from tests.test_kernels_compile import CASES, HOPPER, TYPES  # noqa: E402

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def usage(name: str, options: dict | None = None, constexprs: dict | None = None) -> str:
    kernel, case_constexprs, *own_types = CASES[name]
    constexprs = constexprs or case_constexprs
    types = {**TYPES, **(own_types[0] if own_types else {})}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "*bf16" if a.endswith("_ptr") else "i32")
                 for a in kernel.arg_names}
    if options is None and name.startswith("decode-"):
        launch = DecodeLaunch(constexprs["BLOCK_N"])
        options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages)
    if options is None and name == "prefill":
        *_, warps, stages = _prefill_config(constexprs["HEAD_DIM"], torch.bfloat16, torch.device("cuda"))
        options = dict(num_warps=warps, num_stages=stages)
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER,
                              options=options or {})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        out = subprocess.run([str(PTXAS), "-v", "-arch=sm_90a", ptx.name, "-o", "/dev/null"], capture_output=True,
                             text=True)
    text = out.stdout + out.stderr
    regs = re.search(r"Used (\d+) registers", text)
    spills = re.search(r"(\d+) bytes spill stores", text)
    if regs is None:
        return f"ptxas said: {text.strip()[-200:]}"
    return f"{regs.group(1):>3} registers, {spills.group(1) if spills else 0:>4} bytes of spill stores"


def main() -> None:
    print(f"triton {triton.__version__}")
    if "--decode-sweep" in sys.argv:
        for name in ("decode-direct", "decode-split"):
            for block_n in (32, 64, 128):
                for warps in (2, 4, 8):
                    for stages in (1, 2, 3):
                        constexprs = dict(CASES[name][1], GROUP=2, PAGE=16, BLOCK_N=block_n)
                        print(f"{name:14s} keys {block_n:3d} warps {warps} stages {stages}: "
                              f"{usage(name, dict(num_warps=warps, num_stages=stages), constexprs)}", flush=True)
        return
    for name in CASES:
        print(f"{name:28s} {usage(name)}", flush=True)


if __name__ == "__main__":
    main()
