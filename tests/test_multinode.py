"""`pdcluster serve --ray-address` on a two-node Ray cluster (one machine, `ray.cluster_utils.Cluster`):
prefill workers on the pd_prefill node, decode workers on the pd_decode node, KV over the host
transport between them; then `pdcluster scale` up and down while requests stream."""
from __future__ import annotations

import asyncio
import json
import threading

import pytest

from router.client import AsyncClient
from scripts.cli import main as cli_main
from tests.cluster_harness import RunningCluster, offline_token_ids

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,", "1, 2, 3, 4, 5,"]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)
LONG = dict(max_tokens=96, temperature=0.0, ignore_eos=True)  # long enough to still run while scaling


@pytest.fixture(scope="module")
def ray_nodes():
    from ray.cluster_utils import Cluster

    # The head node takes prefill workers, a second node decode workers: two raylets, two node ids.
    nodes = Cluster(initialize_head=True, head_node_args=dict(num_cpus=2, resources={"pd_prefill": 2}))
    nodes.add_node(num_cpus=2, resources={"pd_decode": 2})
    nodes.wait_for_nodes()
    yield nodes
    nodes.shutdown()


@pytest.fixture(scope="module")
def expected(tiny_qwen3_dir):
    return offline_token_ids(tiny_qwen3_dir, PROMPTS, {"short": GREEDY, "long": LONG})


@pytest.fixture(scope="module")
def cluster(ray_nodes, tiny_qwen3_dir, tmp_path_factory):
    running = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path_factory.mktemp("multinode") / "serve.log",
                             "--ray-address", ray_nodes.address, "--prefill-workers", "2", "--decode-workers", "1",
                             "--prefill-resource", "pd_prefill", "--decode-resource", "pd_decode",
                             "--drain-timeout", "120")
    yield running
    running.stop_cleanly()


def node_of(stats) -> dict[str, str]:
    return {w.worker_id: w.node_id for w in stats.workers}


def test_workers_are_placed_on_the_nodes_of_their_kind(cluster, ray_nodes):
    with cluster.client(timeout=30) as c:
        stats = c.stats()
    head, other = ray_nodes.head_node.node_id, ray_nodes.list_all_nodes()[1].node_id
    by_role = {w.worker_id: w.role for w in stats.workers}
    assert by_role == {"p0": "prefill", "p1": "prefill", "d0": "decode"}
    assert node_of(stats) == {"p0": head, "p1": head, "d0": other}


def test_cross_node_pairs_match_offline_generation_over_the_host_transport(cluster, expected):
    with cluster.client(timeout=120) as c:
        got = [c.generate(p, **GREEDY).token_ids for p in PROMPTS]
    assert got == expected["short"]
    assert "p0 -> d0: host" in cluster.log() or "p1 -> d0: host" in cluster.log()


def test_scaling_up_and_down_under_load_loses_no_request(cluster, expected, capsys):
    """20 clients stream requests back to back while `pdcluster scale` adds a decode worker, then
    removes a decode and a prefill worker: every request comes back whole and equal to offline."""
    done = threading.Event()

    async def client_loop(i: int) -> list[tuple[int, list[int], list[int]]]:
        got = []
        async with AsyncClient(cluster.address, timeout=600) as c:
            while not done.is_set():
                k = (i + len(got)) % len(PROMPTS)
                stream = c.stream(PROMPTS[k], **LONG)
                tokens = [t async for d in stream for t in d.token_ids]
                got.append((k, tokens, stream.result.token_ids))
        return got

    def scale(*flags: str) -> dict:
        assert cli_main(["scale", "--address", cluster.address, *flags, "--timeout", "300"]) == 0
        return json.loads(capsys.readouterr().out.splitlines()[-1])

    async def load_and_scale():
        clients = [asyncio.create_task(client_loop(i)) for i in range(20)]
        await asyncio.sleep(1.0)
        steps = []
        try:
            for flags in (["--decode", "+1"], ["--decode", "-1"], ["--prefill", "-1"]):
                steps.append(await asyncio.to_thread(scale, *flags))
                await asyncio.sleep(1.0)  # the new shape serves a while before the next change
        finally:
            done.set()
        return [r for c in await asyncio.gather(*clients) for r in c], steps

    results, steps = asyncio.run(load_and_scale())
    assert [s["ok"] for s in steps] == [True, True, True], steps
    assert steps[0]["workers"] == ["d1"] and len(steps[1]["workers"]) == len(steps[2]["workers"]) == 1
    assert len(results) >= 40
    for k, streamed, final in results:  # every request whole, streamed and final alike
        assert streamed == final == expected["long"][k]
    assert "-> d1: host" in cluster.log(), "the added decode worker got no request"
    stats = cluster.wait_clean()
    assert stats.requests_in_flight == 0 and stats.queued_requests == 0
    assert all(w.kv_blocks_free == w.kv_blocks_total and w.alive and not w.draining for w in stats.workers)
    removed = set(steps[1]["workers"] + steps[2]["workers"])
    assert {w.worker_id for w in stats.workers} == {"p0", "p1", "d0", "d1"} - removed
    nodes = {w.role: w.node_id for w in stats.workers}
    assert nodes["prefill"] != nodes["decode"]


def test_removing_the_last_worker_of_a_role_is_refused(cluster):
    with cluster.client(timeout=60) as c:
        reply = c.scale("prefill", -1)
        assert not reply.ok and "at least one must stay" in reply.message
        reply = c.scale("colocated", 1)
        assert not reply.ok and "no colocated workers" in reply.message
        assert len(c.stats().workers) == 2
