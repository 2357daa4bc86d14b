"""A whole cluster (router + Ray workers, host KV transport) against the offline engine."""
from __future__ import annotations

import asyncio
import json
import re
import time

import msgpack
import pytest
import zmq

from common import protocol as P
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from router.client import AsyncClient, ServerError
from scripts.cli import main as cli_main
from tests.cluster_harness import RunningCluster

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "1, 2, 3, 4, 5,",
    "Hello, my name is",
    "The quick brown fox jumps over",
]
MAX_TOKENS = 16
GREEDY = dict(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

CASES = [("tiny_qwen3", "disagg"), ("tiny_qwen3", "colocated"), ("smollm2", "disagg")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{mode}" for m, mode in CASES])
def case(request):
    model_name, mode = request.param
    return request.getfixturevalue(f"{model_name}_dir"), mode


@pytest.fixture(scope="module")
def expected(case):
    """What the offline engine (`pdcluster generate`) answers."""
    model, _ = case
    llm = LLM(str(model), device="cpu", kv_cache_memory=64 << 20)
    try:
        return [(o.token_ids, o.text) for o in llm.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)]
    finally:
        llm.close()


@pytest.fixture(scope="module")
def cluster(case, tmp_path_factory):
    model, mode = case
    folder = tmp_path_factory.mktemp("cluster")
    running = RunningCluster(model, mode, folder / "serve.log", "--timeline-dir", str(folder / "timeline"))
    running.timeline_dir = folder / "timeline"
    yield running
    running.stop_cleanly()


def test_greedy_output_equals_offline_generate(case, cluster, expected):
    with cluster.client(timeout=120) as c:
        got = [c.generate(p, **GREEDY) for p in PROMPTS]
    assert [(g.token_ids, g.text) for g in got] == expected
    for g in got:
        assert g.finish_reason == "length" and g.usage.completion_tokens == MAX_TOKENS
        assert g.timings.ttft is not None and len(g.timings.itl) == MAX_TOKENS - 1
        if case[1] == "disagg":  # the reservation's answer comes after dispatch and before the first token
            assert g.timings.queued <= g.timings.reserved < g.timings.ttft
        else:
            assert g.timings.reserved is None


def test_the_log_says_how_long_each_worker_and_the_whole_start_took(case, cluster):
    text = cluster.log_path.read_text(errors="replace")
    seconds = r"(\d+\.\d) s"
    workers = re.findall(rf"(\w+) \((\w+)\) ready in {seconds} \(([^)]*)\)", text)
    roles = {"disagg": [("p0", "prefill"), ("d0", "decode")], "colocated": [("c0", "colocated")]}[case[1]]
    assert [(w, role) for w, role, _, _ in workers] == roles, text
    serving = re.search(rf"serving on \S+ \({case[1]} mode\), ready in {seconds} \(router {seconds}, Ray {seconds}, "
                        rf"tokenizer {seconds}, workers {seconds}\)", text)
    assert serving, text
    total, *parts = map(float, serving.groups())
    assert sum(parts) == pytest.approx(total, abs=0.25)
    for _, _, took, phases in workers:
        named = dict((name, float(s)) for name, s in re.findall(rf"([\w -]+?) {seconds}(?:, |$)", phases))
        # On a CPU: no CUDA graphs and no kernel warm-up; each worker loads within the launcher's wait for them all.
        assert list(named) == ["Ray actor", "imports", "model", "KV pool", "worker"], phases
        assert sum(named.values()) == pytest.approx(float(took), abs=0.3)
        assert float(took) <= parts[3] + 0.1


def test_streamed_deltas_arrive_in_order_and_join_to_the_result(cluster, expected):
    with cluster.client(timeout=120) as c:
        stream = c.stream(PROMPTS[2], **GREEDY)
        deltas = list(stream)
    assert [d.index for d in deltas if d.token_ids] == list(range(MAX_TOKENS))
    assert [t for d in deltas for t in d.token_ids] == stream.result.token_ids == expected[2][0]
    assert "".join(d.text for d in deltas) == stream.result.text == expected[2][1]


def test_32_concurrent_clients_are_all_served(cluster, expected):
    async def one(i: int):
        async with AsyncClient(cluster.address, timeout=300) as c:
            return await c.generate(PROMPTS[i % len(PROMPTS)], **GREEDY)

    async def all_of_them():
        return await asyncio.gather(*(one(i) for i in range(32)))

    results = asyncio.run(all_of_them())
    assert [r.token_ids for r in results] == [expected[i % len(PROMPTS)][0] for i in range(32)]


def test_client_cli_json_equals_generate_json(cluster, case, capsys):
    model, _ = case
    flags = (["--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json"]
             + [a for p in PROMPTS[:2] for a in ("--prompt", p)])
    assert cli_main(["client", "--address", cluster.address, *flags]) == 0
    served = capsys.readouterr().out
    assert cli_main(["generate", "--model", str(model), "--device", "cpu", "--kv-cache-memory", "64MiB", *flags]) == 0
    offline = capsys.readouterr().out
    assert served == offline and len(served.splitlines()) == 2
    assert json.loads(served.splitlines()[0])["index"] == 0


def test_abort_frees_blocks_on_every_worker(cluster):
    with cluster.client(timeout=120) as c:
        stream = c.stream(PROMPTS[0], max_tokens=400, temperature=0.0, ignore_eos=True)
        first = [next(stream) for _ in range(3)]
        assert [d.index for d in first] == [0, 1, 2]
        stream.close()  # sends the abort
    workers = cluster.wait_all_blocks_free()
    assert all(w.kv_blocks_free == w.kv_blocks_total for w in workers), workers
    with cluster.client() as c:
        assert c.stats().requests_in_flight == 0


def test_malformed_frames_get_errors_and_the_cluster_keeps_serving(cluster, expected):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 10_000)
    sock.connect(cluster.address)
    bad_frames = [
        b"\xc1 not msgpack",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"v": 99, "type": "submit", "request_id": "x"}),
        msgpack.packb({"v": 1, "type": "no_such_type"}),
        msgpack.packb({"v": 1, "type": "submit", "request_id": "x", "prompt": "hi", "surprise": 1}),
        msgpack.packb({"v": 1, "type": "submit", "request_id": "x", "prompt": "hi", "sampling": {"top_p": 7}}),
        msgpack.packb({"v": 1, "type": "submit", "request_id": "x", "token_ids": [1, 2**31 - 1]}),
        b"\x00" * (P.MAX_FRAME_BYTES + 1),
    ]
    try:
        for frame in bad_frames:
            sock.send(frame)
            reply = P.decode(sock.recv())
            assert isinstance(reply, P.Error), reply
            assert reply.code in (P.BAD_REQUEST, P.UNSUPPORTED_VERSION, P.UNKNOWN_TYPE, P.TOO_LARGE)
        sock.send_multipart([P.encode(P.Ping(nonce=7)), b"extra frame"])
        assert isinstance(P.decode(sock.recv()), P.Error)
    finally:
        sock.close()
    with cluster.client(timeout=120) as c:
        assert c.generate(PROMPTS[0], **GREEDY).token_ids == expected[0][0]


def test_invalid_requests_are_refused_with_the_field_named(cluster):
    with cluster.client(timeout=60) as c:
        with pytest.raises(ServerError) as e:
            c.generate("", max_tokens=4)
        assert e.value.code == P.BAD_REQUEST and "prompt" in e.value.message
        with pytest.raises(ServerError) as e:
            c.generate([1, 2, 10**8], max_tokens=4)
        assert e.value.code == P.BAD_REQUEST and "token_ids" in e.value.message
        with pytest.raises(ServerError) as e:
            c.generate("word " * 20000, max_tokens=4)
        assert e.value.code == P.BAD_REQUEST and "max_model_len" in e.value.message


def test_the_timeline_shows_each_finished_requests_path_in_order(case, cluster, capsys):
    """`--timeline-dir`: every request that finished passed each point of its mode's path, in order, on the one
    clock of this host; `scripts.timeline` splits the disaggregated ones into their parts."""
    from scripts.timeline import DISAGG_PARTS, load, parts
    from scripts.timeline import main as timeline_main

    _, mode = case
    with cluster.client(timeout=120) as c:
        for p in PROMPTS[:3]:
            c.generate(p, **GREEDY)
    time.sleep(1.5)  # the workers write their events at each heartbeat
    requests = load(cluster.timeline_dir)
    worker = "decode" if mode == "disagg" else "colocated"
    finished = [r for r in requests.values() if (worker, "finished") in r]
    assert len(finished) >= 3
    if mode == "disagg":
        path = [DISAGG_PARTS[0][1]] + [b for _, _, b in DISAGG_PARTS] + [("decode", "finished")]
    else:
        path = [("colocated", "received"), ("colocated", "launched"), ("colocated", "finished")]
    for r in finished:
        times = [r[point]["t"] for point in path]
        assert times == sorted(times), (r, path)
        if mode == "disagg":
            assert all(x >= 0 for x in parts(r).values())
            sent = r[("prefill", "kv_sent")]  # the transport's own part of the handoff, and what of it was CPU
            assert sent["send_us"] >= 0 and 0 <= sent["cpu_us"] <= sent["send_us"] + 1_000
            assert sent["wait_us"] == sent["copy_us"] == 0  # host: nothing to wait for
    # each worker marks its steps too: those that gave the requests their tokens
    steps = [json.loads(line) for path in cluster.timeline_dir.glob("*.jsonl")
             for line in path.read_text().splitlines() if '"event": "step"' in line]
    assert {e["role"] for e in steps} == ({"prefill", "decode"} if mode == "disagg" else {"colocated"})
    assert sum(e["seqs"] for e in steps if e["role"] != "prefill") >= 3 * GREEDY["max_tokens"] - 3
    assert all(e["step_us"] > 0 and e["gpu_us"] == 0 for e in steps)  # no GPU time on the CPU
    timeline_main([str(cluster.timeline_dir)])
    out = capsys.readouterr().out
    assert out.startswith("load point | requests")
    if mode == "disagg":
        assert " of " in out  # a load point whose requests were split into parts


def test_every_block_is_free_at_the_end(cluster):
    workers = cluster.wait_all_blocks_free()
    assert workers and all(w.kv_blocks_free == w.kv_blocks_total and w.alive for w in workers)
