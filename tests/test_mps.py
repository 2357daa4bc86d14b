"""`serve --mps`: workers that share a GPU use an MPS server of the run's own, each role within its share of the SMs.
The real daemon runs on the GPU host (docs/benchmarks.md, "Stop 48"); here a stand-in control program records how
it is called."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.config import ConfigError
from router.config import RouterConfig
from router.launcher import Cluster
from router.mps import MpsServer, parse_shares
from router.serve_config import ServeConfig

FAKE_CONTROL = """#!/bin/sh
{ echo "args=$*"; echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"; [ "$1" = "-d" ] || echo "stdin=$(cat)"; } >> "$MPS_CALLS"
"""


@pytest.fixture
def control(tmp_path, monkeypatch) -> Path:
    """A stand-in nvidia-cuda-mps-control on PATH; returns the file its calls go to."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / "nvidia-cuda-mps-control"
    program.write_text(FAKE_CONTROL)
    program.chmod(program.stat().st_mode | stat.S_IEXEC)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(calls))
    return calls


def test_shares_default_to_the_whole_gpu_and_take_each_role_given():
    assert parse_shares("") == {"prefill": 100, "decode": 100, "colocated": 100}
    assert parse_shares("decode=70, prefill=40") == {"prefill": 40, "decode": 70, "colocated": 100}


@pytest.mark.parametrize("spec, message", [
    ("router=50", "'router' is not one of prefill, decode, colocated"),
    ("decode=0", "decode's share must be 1-100"),
    ("decode=101", "decode's share must be 1-100"),
    ("decode=half", "'decode=half' is not ROLE=PERCENT"),
])
def test_a_bad_share_is_a_usage_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_shares(spec)


def test_the_server_starts_in_its_own_folder_and_quits_when_stopped(control):
    server = MpsServer(parse_shares("decode=70"))
    assert server.env("decode") == {}  # not started: nothing to connect to
    server.start()
    folder = server.folder
    pipe = os.path.join(folder, "pipe")
    assert os.path.isdir(pipe)
    assert control.read_text().splitlines() == ["args=-d", f"pipe={pipe}"]
    assert server.env("decode") == {"CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "70"}
    assert server.env("prefill")["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    server.stop()
    assert control.read_text().splitlines()[2:] == ["args=", f"pipe={pipe}", "stdin=quit"]
    assert not os.path.exists(folder) and server.env("decode") == {}
    server.stop()  # once only
    assert len(control.read_text().splitlines()) == 5


def test_without_the_control_program_mps_is_a_usage_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match="nvidia-cuda-mps-control is not on PATH"):
        MpsServer(parse_shares("")).start()


@pytest.mark.parametrize("gpus_per_worker, shared", [(0.5, True), (1.0, False)])
def test_workers_get_the_server_and_their_roles_share_only_where_they_share_gpus(
        tiny_qwen3_dir, control, gpus_per_worker, shared):
    from common.config import EngineConfig

    engine = EngineConfig(model=str(tiny_qwen3_dir), device="cuda")
    serve = ServeConfig(gpus_per_worker=gpus_per_worker, mps=True, mps_shares="decode=60")
    cluster = Cluster(serve, RouterConfig(model="unused"), engine)
    cluster._start_mps()
    decode, prefill = cluster.worker_env("decode"), cluster.worker_env("prefill")
    assert decode.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == ("60" if shared else None)
    assert prefill.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") == ("100" if shared else None)
    assert control.exists() == shared
    folder = cluster.mps.folder if shared else None
    cluster.shutdown()  # Ray never started: the server still goes
    if shared:
        assert control.read_text().splitlines()[-1] == "stdin=quit" and not os.path.exists(folder)


def test_bad_shares_stop_serve_before_anything_starts(tiny_qwen3_dir):
    from common.config import EngineConfig

    engine = EngineConfig(model=str(tiny_qwen3_dir), device="cuda")
    with pytest.raises(ConfigError, match="mps_shares"):
        Cluster(ServeConfig(mps=True, mps_shares="decode=0"), RouterConfig(model="unused"), engine)
