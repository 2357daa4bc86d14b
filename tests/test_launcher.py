"""How `pdcluster serve` shows workers their GPUs (the GPU side runs in tests/test_kvtransfer_gpu.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from common.config import ConfigError
from router.launcher import Cluster, ServeConfig, own_gpus_first
from router.router import RouterConfig


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
