"""What runs without torch or triton: the router and its tokenizer, the launcher (`serve`'s process), the clients,
the command line, the transport choice, `prepare-model random`, prepare_random / prepare_tokenizer, the benchmark
driver and the benchmark helpers' import (each in a fresh interpreter, whose modules are then read)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "triton"}
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

IN_PROCESS = """
import json, sys
from pathlib import Path

from scripts.model_prep import prepare_random, prepare_tokenizer

out = Path(sys.argv[1])
prepare_random("tiny-qwen3", out / "random", dtype="bf16")
prepare_tokenizer("qwen3-0.6b", out / "tokenizer")
import scripts.bench_gpu, scripts.bench_report, scripts.bench_server, scripts.benchmark, scripts.cli
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def imported_by(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m scripts.cli ARGS`; the top-level packages it imported."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "scripts.cli", *args], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    return proc, {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in lines}


def test_random_preparation_and_bench_driver_import_neither_torch_nor_triton(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", IN_PROCESS, str(tmp_path)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modules = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "numpy" in modules and not modules & HEAVY, modules & HEAVY
    assert ((tmp_path / "random" / "model.safetensors").is_file()
            and (tmp_path / "tokenizer" / "tokenizer.json").is_file())


def test_prepare_model_random_command_imports_neither_torch_nor_triton(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    proc, modules = imported_by("prepare-model", "random", "--config", "tiny-qwen3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out) and (out / "model.safetensors").is_file()
    assert "numpy" in modules and not modules & HEAVY, modules & HEAVY


def test_bench_command_parses_without_torch() -> None:
    proc, modules = imported_by("bench", "--help")
    assert proc.returncode == 0 and "--serve-args" in proc.stdout
    assert not modules & HEAVY, modules & HEAVY


def test_prepare_model_into_a_full_folder_names_the_overwrite_flag(tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "old.txt").write_text("old")
    cmd = [sys.executable, "-m", "scripts.cli", "prepare-model", "random", "--config", "tiny-qwen3", "--out", str(out)]
    refused = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr.splitlines()[-1]
    assert (out / "old.txt").exists()
    done = subprocess.run([*cmd, "--overwrite"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not (out / "old.txt").exists() and (out / "model.safetensors").is_file()


LIGHT = {
    "the router": "import router.router, router.registry",
    "the launcher (serve's process)": "import router.launcher",
    "the HTTP front end and metrics": "import router.http.server, router.http.app, router.metrics",
    "the clients": "import router.client; from router.client import Client, AsyncClient",
    "the command line": "import scripts.cli; scripts.cli.build_parser()",
    "the benchmark driver": "import scripts.benchmark, scripts.bench_report, scripts.bench_metrics",
    "the transport choice": "import kvtransfer.choice, kvtransfer.handoff",
    "the planner (scripts.planner) and its command": "import scripts.planner.sim, scripts.planner.plan, "
                                                     "scripts.planner.plots, scripts.planner.router_ceiling, "
                                                     "scripts.cli.plan",
    "the router benchmarks and their instant workers": "import scripts.bench_router, scripts.bench_frontend, "
                                                       "scripts.instant_workers, scripts.router_load",
    "the command line's plan flags, without the simulator": "import scripts.cli.plan; import sys; "
                                                            "assert 'scripts.planner.sim' not in sys.modules",
}


@pytest.mark.parametrize("what", sorted(LIGHT))
def test_light_processes_load_neither_torch_nor_triton(what):
    code = f"import sys; {LIGHT[what]}; print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", f"{what} loads {run.stdout.strip()}"


def test_the_router_tokenizes_without_torch(tiny_qwen3_dir):
    code = ("import sys; from common.prompt import load_tokenizer, encode_prompt; "
            f"t = load_tokenizer({str(tiny_qwen3_dir)!r}); encode_prompt(t, 'hi', chat=True); "
            "print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
