"""The first hour of a user at the command line: a mistake is one line naming it and a non-zero exit, before Ray
starts; Ctrl-C while the workers load acts at once; flags explain themselves. Each runs `pdcluster` in a fresh
process, as a user would."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent


def pdcluster(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scripts.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("pdcluster: error: "), proc.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def no_weights(tiny_qwen3_dir, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no-weights")
    for f in tiny_qwen3_dir.iterdir():
        if f.suffix != ".safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def test_a_model_folder_without_weights_is_one_line_before_ray_starts(no_weights):
    start = time.monotonic()
    proc = pdcluster("serve", "--model", str(no_weights), "--device", "cpu", "--bind", f"tcp://127.0.0.1:{free_port()}")
    assert "no *.safetensors files in" in one_error_line(proc) and "--load-format dummy" in proc.stderr
    assert time.monotonic() - start < 30 and "ray" not in proc.stderr.lower()
    assert "no *.safetensors" in one_error_line(pdcluster("generate", "--model", str(no_weights), "--device", "cpu",
                                                         "--prompt", "hi"))


def test_a_malformed_tokenizer_is_one_line_naming_it_before_ray_starts(tiny_qwen3_dir, tmp_path):
    for f in tiny_qwen3_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "tokenizer.json").write_text("{not json")
    start = time.monotonic()
    proc = pdcluster("serve", "--model", str(tmp_path), "--device", "cpu", "--bind", f"tcp://127.0.0.1:{free_port()}")
    assert f"tokenizer: cannot load {tmp_path}'s tokenizer" in one_error_line(proc)
    assert time.monotonic() - start < 30 and "ray" not in proc.stderr.lower()
    proc = pdcluster("generate", "--model", str(tmp_path), "--device", "cpu", "--prompt", "hi")
    assert f"tokenizer: cannot load {tmp_path}'s tokenizer" in one_error_line(proc)


def test_a_port_in_use_is_one_line(tiny_qwen3_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = pdcluster("serve", "--model", str(tiny_qwen3_dir), "--device", "cpu", "--bind",
                         f"tcp://127.0.0.1:{port}")
        line = one_error_line(proc)
        assert f"bind: cannot listen on tcp://127.0.0.1:{port}" in line and "in use" in line
        proc = pdcluster("serve", "--model", str(tiny_qwen3_dir), "--device", "cpu", "--bind",
                         f"tcp://127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{port}")
        assert f"http: cannot listen on 127.0.0.1:{port}" in one_error_line(proc)


def test_ctrl_c_while_the_workers_load_stops_at_once_and_leaves_nothing(tiny_qwen3_dir, tmp_path):
    """Workers that cannot be placed (GPUs asked for on a machine without) load forever: Ctrl-C then stops serve
    within seconds, says it is shutting down, never says it is serving, and leaves no process behind."""
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", str(tiny_qwen3_dir),
                                 "--device", "cuda", "--bind", f"tcp://127.0.0.1:{free_port()}"],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 120
        while "starting 2 workers" not in log.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(1.0)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "shutting down (interrupted while the workers were starting)" in text, text
    assert "serving on" not in text and proc.returncode in (0, 130)
    assert took < 20, f"took {took:.1f} s to stop"
    psutil.wait_procs([c for c in children if c.is_running()], timeout=20)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_flags_explain_themselves():
    top = pdcluster("--version")
    assert top.returncode == 0 and top.stdout.startswith("pdcluster ")
    serve = " ".join(pdcluster("serve", "--help").stdout.split())  # as read, whatever argparse's line breaks
    assert "(default: 2GiB)" in serve and "(default: off)" in serve and "(default: on)" in serve
    assert "2147483648" not in serve
    client = " ".join(pdcluster("client", "--help").stdout.split())
    for flag in ("--max-tokens N", "--temperature X", "--top-p X", "--top-k N", "--seed N", "--stream"):
        assert flag in client
    assert "greedy" in client and "--connect-timeout" in client
    bad = pdcluster("--log-level", "loud", "client", "--ping")
    assert bad.returncode == 2 and "invalid choice: 'LOUD'" in bad.stderr
    prep = pdcluster("prepare-model", "--help").stdout
    assert "qwen3-8b" in prep and "tiny-qwen3" in prep


def test_a_worker_that_refuses_to_start_under_ray_is_its_one_line_reason(tiny_qwen3_dir):
    """A worker's ConfigError in its init (cuda asked for, the worker placed without a GPU where torch sees none)
    stops `serve` with that worker's line, not Ray's error around it nor the worker's traceback."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the worker would start")
    proc = pdcluster("serve", "--model", str(tiny_qwen3_dir), "--device", "cuda", "--gpus-per-worker", "0",
                     "--prefill-workers", "0", "--prefill-gpu-memory-utilization", "0.5",
                     "--decode-gpu-memory-utilization", "0.5", "--bind", f"tcp://127.0.0.1:{free_port()}",
                     timeout=180)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and lines[-1] == ("pdcluster: error: decode worker d0: device: cuda asked for but "
                                                  "torch sees no CUDA device"), proc.stderr
    assert "ActorDiedError" not in proc.stderr and "Traceback" not in proc.stderr and "RayTaskError" not in proc.stderr
