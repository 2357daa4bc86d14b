"""Triton kernel tests that run on a GPU, or without one in Triton's interpreter on CPU.

A test module imports `INTERPRETED` and the `device` fixture from here and defines
`test_interpreter_suite = interpreter_suite(__file__)`: on a plain run (no GPU) that test re-runs the
module in a subprocess with TRITON_INTERPRET=1, which must be set before triton is imported.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[1]
GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(params=[pytest.param("cpu", id="interp") if INTERPRETED else pytest.param("cuda", marks=GPU)])
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def interpreter_suite(test_file: str, timeout: float = 900):
    @pytest.mark.skipif(INTERPRETED, reason="this is the interpreter run")
    def test_interpreter_suite() -> None:
        # ROOT first, then whatever the caller's path held (the GPU host brings pyzmq and ray that way)
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
        cmd = [sys.executable, "-m", "pytest", test_file, "-q", "-m", "not gpu", "-p", "no:cacheprovider"]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-10000:] + proc.stderr[-3000:]
    return test_interpreter_suite
