"""A plain install, as a new user makes it: a fresh venv with the CPU build of torch and `pip install -e .`, no
extras and no triton. Every command a CPU user starts with must work there (it once crashed on `import triton`)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster_harness import free_port

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"  # the CPU build the Makefile installs (an unpinned torch pulls CUDA wheels)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """bin/ of a fresh venv holding CPU torch and this project, nothing else of ours."""
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=300)
    pip = [str(home / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for what in ([TORCH], ["-e", str(ROOT)]):
        run = subprocess.run([*pip, *what], capture_output=True, text=True, timeout=1200)
        assert run.returncode == 0, f"pip install {' '.join(what)} failed:\n{run.stderr[-4000:]}"
    return home / "bin"


def run(venv: Path, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """A command of the venv, from a folder outside the repository (so only the install is on the path)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(venv / args[0]), *args[1:]], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_a_plain_install_has_no_triton(venv, tmp_path):
    probe = run(venv, "python", "-c", "import importlib.util as u; print(u.find_spec('triton') is None)", cwd=tmp_path)
    assert probe.stdout.strip() == "True", "the venv must be the plain install this test is about"


def test_a_plain_install_runs_the_cpu_commands(venv, tmp_path):
    help_ = run(venv, "pdcluster", "--help", cwd=tmp_path)
    assert help_.returncode == 0 and "serve" in help_.stdout and "prepare-model" in help_.stdout, help_.stderr
    model = tmp_path / "tiny"
    prep = run(venv, "pdcluster", "prepare-model", "random", "--config", "tiny-qwen3", "--out", str(model),
               cwd=tmp_path)
    assert prep.returncode == 0 and (model / "config.json").is_file(), prep.stderr[-2000:]
    gen = run(venv, "pdcluster", "generate", "--model", str(model), "--device", "cpu", "--prompt", "hello",
              "--max-tokens", "4", "--json", cwd=tmp_path)
    assert gen.returncode == 0 and '"token_ids"' in gen.stdout, gen.stderr[-2000:]

    address = f"tcp://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    serve = subprocess.Popen([str(venv / "pdcluster"), "serve", "--model", str(model), "--device", "cpu",
                              "--mode", "colocated", "--bind", address, "--kv-cache-memory", "64MiB"],
                             cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        ping = run(venv, "pdcluster", "client", "--address", address, "--ping", "--timeout", "300", cwd=tmp_path)
        assert ping.returncode == 0, ping.stderr[-2000:]
        out = run(venv, "pdcluster", "client", "--address", address, "--prompt", "hello", "--max-tokens", "4",
                  "--json", cwd=tmp_path)
        assert out.returncode == 0 and '"token_ids"' in out.stdout, out.stderr[-2000:]
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        try:
            serve.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
    assert serve.returncode == 0, serve.stderr.read()[-2000:]
