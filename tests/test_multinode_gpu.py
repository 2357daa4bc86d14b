"""Two simulated Ray nodes with one GPU each (`ray.cluster_utils.Cluster`): the prefill worker on one,
the decode worker on the other, so the router must pick NCCL for the pair; outputs equal offline."""
from __future__ import annotations

import os
import signal

import pytest
import torch

from tests.cluster_harness import RunningCluster

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Hello, my name is"]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
ENGINE = ["--num-kv-blocks", "1024", "--gpu-memory-utilization", "0.3"]

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                                  reason="needs 2 GPUs")]


@pytest.fixture(scope="module")
def expected(tiny_qwen3_dir):
    from common.engine.llm import LLM
    from common.sampling_params import SamplingParams

    llm = LLM(str(tiny_qwen3_dir), device="cuda", num_kv_blocks=1024, gpu_memory_utilization=0.3, max_num_seqs=64,
              max_num_batched_tokens=1024)  # as the cluster harness's workers
    try:
        return [llm.generate([p], SamplingParams(**GREEDY), use_tqdm=False)[0].token_ids for p in PROMPTS]
    finally:
        llm.close()
        torch.cuda.empty_cache()


@pytest.fixture(scope="module")
def ray_nodes():
    from ray.cluster_utils import Cluster

    # Each simulated node's raylet sees one GPU of its own (Ray maps its GPU ids into that list).
    visible = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0,1").split(",")
    nodes = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=2, num_gpus=1, resources={"pd_prefill": 1}, env_vars={"CUDA_VISIBLE_DEVICES": visible[0]}))
    nodes.add_node(num_cpus=2, num_gpus=1, resources={"pd_decode": 1}, env_vars={"CUDA_VISIBLE_DEVICES": visible[1]})
    nodes.wait_for_nodes()
    yield nodes
    nodes.shutdown()


def test_prefill_and_decode_on_two_nodes_pair_over_nccl(ray_nodes, tiny_qwen3_dir, expected, tmp_path):
    cluster = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path / "serve.log", "--device", "cuda", *ENGINE,
                             "--ray-address", ray_nodes.address, "--gpus-per-worker", "1",
                             "--prefill-resource", "pd_prefill", "--decode-resource", "pd_decode")
    try:
        with cluster.client(timeout=120) as c:
            nodes = {w.role: w.node_id for w in c.stats().workers}
            got = [c.generate(p, **GREEDY).token_ids for p in PROMPTS]
        assert nodes["prefill"] != nodes["decode"]
        assert got == expected, cluster.log()
        assert "p0 -> d0: nccl" in cluster.log(), cluster.log()
        workers = cluster.wait_all_blocks_free()
        assert all(w.kv_blocks_free == w.kv_blocks_total for w in workers), workers
    finally:
        status = cluster.stop()
        for pid in cluster.orphans():
            os.kill(pid, signal.SIGKILL)
    assert status == 0, cluster.log()
