"""Stop 42 (issue 20): registers and spills of every Triton kernel variant `tests/test_kernels_compile.py` compiles,
as ptxas reports them for Hopper (sm_90a), on a machine without a GPU. Run it under the Triton of the GPU host (3.6.0
at stop 42: `pip install triton==3.6.0` into a path put ahead of the venv's), since another Triton's compiler
allocates differently. The attention kernels are compiled with the warps and stages the engine launches them with
(`DecodeLaunch`, `_prefill_config` for bf16), the others with Triton's defaults.

Run: python docs/gpu_runs/stop42_kernel_registers.py
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


def usage(name: str) -> str:
    kernel, constexprs, *own_types = CASES[name]
    types = {**TYPES, **(own_types[0] if own_types else {})}
    signature = {a: "constexpr" if a in constexprs else types.get(a, "*bf16" if a.endswith("_ptr") else "i32")
                 for a in kernel.arg_names}
    options = {}
    if name.startswith("decode-"):
        launch = DecodeLaunch(constexprs["BLOCK_N"])
        options = dict(num_warps=launch.num_warps, num_stages=launch.num_stages)
    if name == "prefill":
        *_, warps, stages = _prefill_config(constexprs["HEAD_DIM"], torch.bfloat16, torch.device("cuda"))
        options = dict(num_warps=warps, num_stages=stages)
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER,
                              options=options)
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
    for name in CASES:
        print(f"{name:28s} {usage(name)}", flush=True)


if __name__ == "__main__":
    main()
