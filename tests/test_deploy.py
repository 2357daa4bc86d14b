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
