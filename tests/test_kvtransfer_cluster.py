"""A whole cluster moving KV with the nccl transport, on CPU (gloo): the prefill and decode workers are
Ray actors in their own processes, so this is the streaming path end to end (link set-up on the first
handoff, futures polled by the worker loops, aborts while blocks are held)."""
from __future__ import annotations

import asyncio
import time

import pytest

from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from router.client import AsyncClient
from scripts.cli import main as cli_main
from tests.cluster_harness import RunningCluster

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4, 5,", "Hello, my name is"]
GREEDY = dict(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def expected(tiny_qwen3_dir):
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    try:
        return [o.token_ids for o in llm.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def cluster(tiny_qwen3_dir, tmp_path_factory):
    running = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path_factory.mktemp("cluster") / "serve.log",
                             "--kv-transport", "nccl")
    yield running
    running.stop_cleanly()


def test_greedy_output_over_gloo_equals_offline_generate(cluster, expected):
    with cluster.client(timeout=120) as c:
        assert [c.generate(p, **GREEDY).token_ids for p in PROMPTS] == expected

    async def all_at_once():
        async with AsyncClient(cluster.address, timeout=300) as c:
            return await asyncio.gather(*(c.generate(PROMPTS[i % len(PROMPTS)], **GREEDY) for i in range(16)))

    results = asyncio.run(all_at_once())
    assert [r.token_ids for r in results] == [expected[i % len(PROMPTS)] for i in range(16)]


def test_abort_frees_blocks_on_every_worker(cluster):
    with cluster.client(timeout=120) as c:
        stream = c.stream(PROMPTS[0], max_tokens=400, temperature=0.0, ignore_eos=True)
        assert [next(stream).index for _ in range(3)] == [0, 1, 2]
        stream.close()
    workers = cluster.wait_all_blocks_free()
    assert all(w.kv_blocks_free == w.kv_blocks_total for w in workers), workers


def test_every_block_is_free_at_the_end(cluster):
    workers = cluster.wait_all_blocks_free()
    assert workers and all(w.kv_blocks_free == w.kv_blocks_total and w.alive for w in workers)


def test_the_link_opens_before_the_cluster_is_ready(tiny_qwen3_dir, tmp_path):
    """As the workers meet, the router has the prefill worker open its KV link to the decode worker (a link's first
    NCCL operation sets its communicator up, which the pair's first request would otherwise wait for), and the
    cluster is ready only once it is open; the handoffs then go over it (tests/test_kvtransfer.py: a link opened
    ahead carries them)."""
    running = RunningCluster(tiny_qwen3_dir, "disagg", tmp_path / "serve.log", "--kv-transport", "nccl")
    try:
        with running.client(timeout=120) as c:
            stats = c.stats()  # ready: no request sent yet
            assert stats.kv_links_opening == 0 and stats.totals.kv_links_opened == 1
            assert [c.generate(p, **GREEDY).token_ids for p in PROMPTS[:2]] == [
                c.generate(p, **GREEDY).token_ids for p in PROMPTS[:2]]
            assert c.stats().totals.kv_links_opened == 1
    finally:
        running.stop_cleanly()


def test_cuda_ipc_on_cpu_is_refused_before_anything_starts(tiny_qwen3_dir, capsys):
    started = time.monotonic()
    assert cli_main(["serve", "--model", str(tiny_qwen3_dir), "--device", "cpu", "--kv-transport", "cuda_ipc",
                     "--bind", "tcp://127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert "kv_transport: the cuda_ipc KV transport needs CUDA workers; these run on cpu" in err
    assert time.monotonic() - started < 30  # no Ray, no model loaded
