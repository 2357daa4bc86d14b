"""The `ray up` configs in deploy/ pass Ray's own cluster-config validation and name our node kinds."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "deploy").glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_there_is_an_on_premise_and_a_cloud_config():
    providers = {load(p)["provider"]["type"] for p in CONFIGS}
    assert {"local", "aws"} <= providers


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_passes_rays_validation(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(load(path))  # what `ray up` does first: defaults merged in, then checked
    validate_config(config)
    assert config["head_node_type"] in config["available_node_types"]


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_gives_the_node_kinds_their_resources_and_installs_pdcluster(path):
    config = load(path)
    assert any("pip install" in c and "pdcluster" in c for c in config["setup_commands"])
    if config["provider"]["type"] == "local":  # one node type: the resources come from `ray start`
        starts = " ".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
        for name in ("pd_router", "pd_prefill", "pd_decode"):
            assert name in starts
    else:
        types = config["available_node_types"]
        assert "pd_router" in types[config["head_node_type"]]["resources"]
        kinds = {name for t in types.values() for name in t["resources"]}
        assert {"pd_prefill", "pd_decode"} <= kinds


def test_the_serve_and_scale_commands_in_docs_deploy_parse():
    import re
    import shlex

    from scripts.cli import build_parser

    text = (ROOT / "docs" / "deploy.md").read_text().replace("\\\n", " ")
    serve = re.search(r"'(pdcluster serve [^']*)'", text).group(1)
    args = build_parser().parse_args(shlex.split(serve)[1:])
    assert (args.ray_address, args.bind, args.prefill_resource, args.decode_resource) == (
        "auto", "tcp://0.0.0.0:5555", "pd_prefill", "pd_decode")
    assert args.auth_token_file
    for line in re.findall(r"^pdcluster scale [^#\n]*", text, flags=re.M):
        if "..." not in line:
            build_parser().parse_args(shlex.split(line.replace("$HEAD", "head"))[1:])


def worker_start(prefill_hosts: str = "10.0.0.11 10.0.0.12", cpu_units: str = "") -> str:
    """deploy/onprem.yaml's worker start command (the one that picks the host's kind and count)."""
    command = load(ROOT / "deploy" / "onprem.yaml")["worker_start_ray_commands"][-1]
    assert 'PREFILL_HOSTS="10.0.0.11 10.0.0.12"' in command and 'CPU_UNITS=""' in command
    return (command.replace('PREFILL_HOSTS="10.0.0.11 10.0.0.12"', f'PREFILL_HOSTS="{prefill_hosts}"')
            .replace('CPU_UNITS=""', f'CPU_UNITS="{cpu_units}"'))


def run_start(tmp_path: Path, command: str, addresses: str, gpus: int | None):
    """Runs `command` with stand-ins for `hostname`, `nvidia-smi` (absent when gpus is None) and `ray`; returns
    (exit status, stderr, the `ray` calls)."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stubs = {"hostname": f'[ "$1" = -I ] && echo "{addresses} " || echo gpuhost\n',
             "ray": f'echo "$@" >> {tmp_path}/ray-calls\n'}
    if gpus is not None:
        stubs["nvidia-smi"] = "".join(f'echo "GPU {i}: NVIDIA L40S (UUID: GPU-{i})"\n' for i in range(gpus))
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RAY_HEAD_IP": "10.0.0.10"}
    done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)
    calls = (tmp_path / "ray-calls").read_text().splitlines() if (tmp_path / "ray-calls").exists() else []
    return done.returncode, done.stderr, calls


def test_a_host_whose_gpus_cannot_be_counted_fails_its_start_clearly(tmp_path):
    """Before: `nvidia-smi -L | wc -l` on a host without it gave `{"pd_decode": 0}` and a node no worker could use."""
    status, err, calls = run_start(tmp_path, worker_start(), "10.0.0.21", gpus=None)
    assert status != 0 and not calls
    assert "pdcluster: no GPUs counted on gpuhost (10.0.0.21" in err and "set CPU_UNITS" in err


@pytest.mark.parametrize("addresses, gpus, cpu_units, resources", [
    ("10.0.0.11", 4, "", '{"pd_prefill": 4}'),
    ("192.168.1.5 10.0.0.12", 2, "", '{"pd_prefill": 2}'),  # any of the host's addresses
    ("10.0.0.21", 8, "", '{"pd_decode": 8}'),
    ("10.0.0.111", 1, "", '{"pd_decode": 1}'),  # an address is matched whole, not as a prefix or a pattern
    ("10.0.0.1", 1, "", '{"pd_decode": 1}'),
    ("10.0.0.21", None, "2", '{"pd_decode": 2}'),  # a CPU host: the units it is given
])
def test_worker_hosts_start_ray_with_their_kind_and_count(tmp_path, addresses, gpus, cpu_units, resources):
    status, err, calls = run_start(tmp_path, worker_start(cpu_units=cpu_units), addresses, gpus)
    assert status == 0, err
    assert calls == [f"start --address=10.0.0.10:6379 --resources={resources}"]


def test_prefill_hosts_are_matched_as_fixed_strings():
    assert "grep -Fqx" in worker_start() and "grep -qw" not in worker_start()
