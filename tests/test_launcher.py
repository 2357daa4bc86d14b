"""How `pdcluster serve` shows workers their GPUs (the GPU side runs in tests/test_kvtransfer_gpu.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.config import ConfigError
from router.config import RouterConfig
from router.launcher import Cluster, ServeConfig
from router.worker_actor import own_gpus_first


@pytest.mark.parametrize("assigned, node, count, expected", [
    (["1"], None, 2, "1,0"),  # node without CUDA_VISIBLE_DEVICES: every GPU, its own first
    (["0"], None, 2, "0,1"),
    (["2", "3"], None, 4, "2,3,0,1"),  # a tensor-parallel worker: its ranks keep cuda:0 and cuda:1
    (["5"], "4,5, 7", 8, "5,4,7"),  # a node started with CUDA_VISIBLE_DEVICES: only those, ids as given
    (["0"], None, 1, "0"),
    (["GPU-a1"], "GPU-b2,GPU-a1", 2, "GPU-a1,GPU-b2"),  # UUIDs work like indices
])
def test_own_gpus_come_first_then_the_rest_of_the_node(assigned, node, count, expected):
    assert own_gpus_first(assigned, node, count) == expected


def test_unknown_gpu_visibility_is_a_usage_error():
    engine = SimpleNamespace(device="cuda", kv_transport="auto")
    with pytest.raises(ConfigError, match="gpu_visibility: must be one of node, own, got 'all'"):
        Cluster(ServeConfig(gpu_visibility="all"), RouterConfig(model="unused"), engine)


@pytest.mark.parametrize("visibility, device, noset", [("node", "cuda", True), ("own", "cuda", False),
                                                       ("node", "cpu", False)])
def test_ray_leaves_cuda_visible_devices_to_workers_only_for_node_visibility(tiny_qwen3_dir, visibility, device,
                                                                             noset):
    from common.config import EngineConfig
    from router.worker_actor import NOSET_CUDA_VISIBLE_DEVICES

    engine = EngineConfig(model=str(tiny_qwen3_dir), device=device)
    env = Cluster(ServeConfig(gpu_visibility=visibility), RouterConfig(model="unused"), engine).worker_env("prefill")
    assert (env.get(NOSET_CUDA_VISIBLE_DEVICES) == "1") == noset
    assert ("OMP_NUM_THREADS" in env) == (device == "cpu")


def test_auto_device_follows_the_ray_clusters_gpus(tiny_qwen3_dir, monkeypatch):
    import ray

    from common.config import EngineConfig

    monkeypatch.setattr(ray, "init", lambda **kw: None)
    for gpus, device in ((0, "cpu"), (2, "cuda")):
        monkeypatch.setattr(ray, "cluster_resources", lambda gpus=gpus: {"CPU": 4.0, "GPU": float(gpus)})
        cluster = Cluster(ServeConfig(), RouterConfig(model="unused"), EngineConfig(model=str(tiny_qwen3_dir)))
        cluster.start_ray()
        assert cluster.engine_config.device == device


@pytest.mark.parametrize("address", [None, "auto", "10.0.0.1:6379"])
def test_serve_starts_its_own_ray_unless_given_an_address(tiny_qwen3_dir, monkeypatch, address):
    """Without --ray-address, a Ray of its own even if one already runs on this machine (ray.init alone would
    join that one and refuse num_cpus); with it, the cluster named, and no num_cpus."""
    import ray

    from common.config import EngineConfig

    seen: dict = {}
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    engine = EngineConfig(model=str(tiny_qwen3_dir), device="cpu")
    Cluster(ServeConfig(ray_address=address), RouterConfig(model="unused"), engine).start_ray()
    assert seen["address"] == (address or "local") and ("num_cpus" in seen) == (address is None)


def test_a_worker_shown_its_node_sees_its_own_gpus_first_unless_cuda_started(monkeypatch):
    import os

    import torch

    from router.worker_actor import see_node_gpus

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    see_node_gpus(["2"])  # too late: CUDA has read the variable already
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    see_node_gpus(["2"])
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,0,1,3"


def node(address: str, alive: bool = True, **resources: float) -> dict:
    return {"NodeManagerAddress": address, "Alive": alive, "Resources": {"CPU": 2.0, **resources}}


def test_a_loopback_worker_endpoint_is_refused_when_workers_could_land_on_another_node():
    """`serve --bind tcp://0.0.0.0:5555` without `--worker-host` on a multi-host cluster: the workers on the
    other hosts could never reach the router (tests/test_ray_up.py runs it for real)."""
    from router.launcher import nodes_out_of_reach

    nodes = [node("10.0.0.10", pd_router=1), node("10.0.0.11", pd_prefill=2), node("10.0.0.12", pd_decode=2),
             node("10.0.0.13", alive=False, pd_decode=2)]
    needs = [{"pd_prefill": 1.0}, {"pd_decode": 1.0}]
    assert nodes_out_of_reach("127.0.0.1", "10.0.0.10", nodes, needs) == ["10.0.0.11", "10.0.0.12"]
    assert nodes_out_of_reach("localhost", "10.0.0.10", nodes, [{"pd_decode": 1.0}]) == ["10.0.0.12"]
    assert nodes_out_of_reach("127.0.0.1", "10.0.0.10", nodes, [{}]) == ["10.0.0.11", "10.0.0.12"]
    for host in ("0.0.0.0", "10.0.0.10"):  # reachable: bound on every interface, or on the node's address
        assert nodes_out_of_reach(host, "10.0.0.10", nodes, needs) == []
    # One machine (ray.cluster_utils, tests/test_multinode.py): every node has this node's address.
    assert nodes_out_of_reach("127.0.0.1", "10.0.0.10", [node("10.0.0.10", pd_decode=1)] * 2, needs) == []
    # Nodes that could take none of the workers do not matter.
    assert nodes_out_of_reach("127.0.0.1", "10.0.0.10", [node("10.0.0.11", pd_other=1)], needs) == []
