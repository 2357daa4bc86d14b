"""Faults, overload and bad input against a real cluster: 2 prefill + 2 decode workers on Ray, CURVE on.

One serve subprocess for the module. Faults are injected through PDCLUSTER_FAULT_DIR (common/faults.py):
a test arms one by writing a file, the first worker it hits fires it once. Every test ends by checking
that nothing was left behind (all KV blocks free on every worker, no request in the router); the last
one stops the cluster with SIGTERM while a request is open. docs/reliability.md lists these outcomes.
"""
from __future__ import annotations

import asyncio
import os
import signal
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import auth
from common import protocol as P
from router.client import AsyncClient, ClientTimeout, ServerError
from scripts.cli import main as cli_main
from tests.cluster_harness import RunningCluster

TOKEN = "reliability-test-secret-0123456789"
WORKER_TIMEOUT = 3.0
HANDOFF_TIMEOUT = 5.0
MAX_QUEUED = 16
MAX_WORKER_REQUESTS = 8
CAPACITY = MAX_QUEUED + 2 * MAX_WORKER_REQUESTS  # requests in flight before `overloaded`
GREEDY = dict(temperature=0.0, ignore_eos=True)


def prompt(first: int, n: int = 24) -> list[int]:
    """Token ids starting with `first`: markers (>= 400) aim a fault at one request, others start below 100."""
    return [first] + [(first * 7 + i) % 300 + 1 for i in range(n - 1)]


@pytest.fixture(scope="module")
def fault_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def cluster(tiny_qwen3_dir, fault_dir, tmp_path_factory):
    running = RunningCluster(
        tiny_qwen3_dir, "disagg", tmp_path_factory.mktemp("cluster") / "serve.log",
        "--prefill-workers", "2", "--decode-workers", "2", "--worker-timeout", str(WORKER_TIMEOUT),
        "--handoff-timeout", str(HANDOFF_TIMEOUT), "--max-queued-requests", str(MAX_QUEUED),
        "--max-worker-requests", str(MAX_WORKER_REQUESTS), "--retry-after", "0.2",
        env={"PDCLUSTER_FAULT_DIR": str(fault_dir), auth.TOKEN_ENV: TOKEN}, auth_token=TOKEN)
    yield running
    running.stop_cleanly()


def arm(fault_dir, name: str, marker: int) -> None:
    (fault_dir / name).write_text(str(marker))


def fired(fault_dir, name: str) -> list[str]:
    return [p.name.rsplit("-", 1)[1] for p in fault_dir.glob(f"{name}.fired-*")]


def assert_clean(cluster: RunningCluster) -> None:
    stats = cluster.wait_clean()
    assert stats.requests_in_flight == 0 and stats.queued_requests == 0, stats
    for w in stats.workers:
        assert w.alive and w.kv_blocks_free == w.kv_blocks_total, (w, cluster.log())


def alive(cluster: RunningCluster) -> dict[str, bool]:
    with cluster.client() as c:
        return {w.worker_id: w.alive for w in c.stats(timeout=10).workers}


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


# --- security ------------------------------------------------------------------------------------


def test_clients_without_the_token_get_nothing(cluster, tmp_path):
    ctx = zmq.Context.instance()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    # The router refuses the handshake and ZMQ drops the connection: a send after that has nowhere to go and would
    # block for good (it hung a CI run once), so each send gives up after a second. Nothing may come back either way.
    plain.setsockopt(zmq.SNDTIMEO, 1000)
    plain.connect(cluster.address)
    try:
        for msg in (P.Ping(nonce=1), P.Submit(request_id="x", token_ids=[1, 2, 3])):
            try:
                plain.send(P.encode(msg))
            except zmq.Again:
                pass
        assert not plain.poll(2000), "an unauthenticated client got an answer"
    finally:
        plain.close()
    with cluster.client(auth_token="not-the-token-but-long-enough") as c:
        with pytest.raises(ClientTimeout):
            c.ping(timeout=2)
    with cluster.client() as c:
        assert c.ping(timeout=10) < 10
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    saved = os.environ.pop(auth.TOKEN_ENV, None)
    try:
        assert cli_main(["client", "--address", cluster.address, "--auth-token-file", str(token_file),
                         "--stats", "--timeout", "10"]) == 0
    finally:
        if saved is not None:
            os.environ[auth.TOKEN_ENV] = saved


# --- worker faults -------------------------------------------------------------------------------


def test_a_decode_worker_killed_mid_stream(cluster, fault_dir):
    """Its streamed request, opted out of migration, ends with `aborted`; the other stream goes on; the router
    notices within seconds; Ray restarts the worker and it rejoins; nothing is left behind."""
    with cluster.client(timeout=120) as a, cluster.client(timeout=120) as b:
        doomed = a.stream(prompt(401), max_tokens=1000, migrate=False, **GREEDY)
        first = [next(doomed) for _ in range(3)]
        other = b.stream(prompt(7), max_tokens=60, **GREEDY)  # the other decode worker has more free blocks
        next(other)
        arm(fault_dir, "crash_decode", 401)
        armed_at = time.monotonic()
        with pytest.raises(ServerError) as e:
            for _ in doomed:
                pass
        noticed = time.monotonic() - armed_at  # the error is sent when the router has noticed
        victim = wait_for(lambda: fired(fault_dir, "crash_decode"), 5, "the fault to fire")[0]
        assert e.value.code == P.ABORTED and f"decode worker {victim}" in e.value.message, e.value
        assert e.value.retry_after is not None and first[0].index == 0
        rest = list(other)
        assert other.result is not None and len(other.result.token_ids) == 60, "the other stream finished"
        assert len(rest) >= 1
        # Served meanwhile (by the surviving decode worker, or by the victim once it is back).
        assert len(a.generate(prompt(8), max_tokens=8, **GREEDY).token_ids) == 8
    assert noticed < WORKER_TIMEOUT + 3
    wait_for(lambda: alive(cluster)[victim], 60, f"{victim} to rejoin")
    assert_clean(cluster)


async def stream_all(address: str, jobs: list[tuple[list[int], dict]],
                     started: asyncio.Event | None = None) -> list[tuple[list[P.Delta], object]]:
    """Streams every job at once; `started` is set once the first has had 3 tokens. Each stream's deltas and
    result."""
    async with AsyncClient(address, timeout=300, auth_token=TOKEN) as c:
        async def one(i: int, ids: list[int], sampling: dict):
            deltas = []
            stream = c.stream(ids, **sampling)
            async for d in stream:
                deltas.append(d)
                if i == 0 and len(deltas) == 3 and started is not None:
                    started.set()
            return deltas, stream.result

        return await asyncio.gather(*(one(i, ids, sampling) for i, (ids, sampling) in enumerate(jobs)))


def test_a_decode_worker_killed_under_streaming_clients_loses_nothing(cluster, fault_dir):
    """Migration: 32 streams over both decode workers, greedy and seeded-sampled; one decode worker is killed
    mid-stream. Every request completes, each stream's tokens have no gap and no duplicate and equal an
    uninterrupted run's, and every block is free after."""
    marker = 406  # the first job's: the victim is the decode worker streaming it, after its third token
    jobs = [(prompt(marker if i == 0 else 60 + i), dict(max_tokens=200 if i == 0 else 40, ignore_eos=True,
                                                         temperature=0.0)
             if i % 2 == 0 else dict(max_tokens=40, ignore_eos=True, temperature=1.0, seed=1000 + i))
            for i in range(32)]
    reference = asyncio.run(stream_all(cluster.address, jobs))
    with cluster.client() as c:
        migrations = c.stats(timeout=10).totals.migrations

    async def killed():
        started = asyncio.Event()

        async def arm_when_started():
            await started.wait()
            arm(fault_dir, "crash_decode", marker)
        armer = asyncio.create_task(arm_when_started())
        try:
            return await stream_all(cluster.address, jobs, started)
        finally:
            armer.cancel()

    outcome = asyncio.run(killed())
    victim = wait_for(lambda: fired(fault_dir, "crash_decode"), 5, "the fault to fire")[0]
    for (deltas, result), (_, ref_result), (_, sampling) in zip(outcome, reference, jobs):
        tokens = [t for d in deltas for t in d.token_ids]
        assert [d.index for d in deltas if d.token_ids] == list(range(len(tokens)))  # no gap, no duplicate
        assert result is not None and tokens == result.token_ids == ref_result.token_ids
        assert result.finish_reason == "length" and len(tokens) == sampling["max_tokens"]
    with cluster.client() as c:
        assert c.stats(timeout=10).totals.migrations > migrations  # the first job's, at least, moved
    wait_for(lambda: alive(cluster)[victim], 60, f"{victim} to rejoin")
    assert_clean(cluster)


def test_a_prefill_worker_killed_with_requests_queued(cluster, fault_dir):
    """Its queued prompts go to the other prefill worker; every request finishes; it rejoins."""
    arm(fault_dir, "crash_prefill", 402)

    async def go():
        async with AsyncClient(cluster.address, timeout=120, auth_token=TOKEN) as c:
            firsts = [402] + list(range(10, 16))
            return await asyncio.gather(*(c.generate(prompt(f, 40), max_tokens=6, **GREEDY) for f in firsts))

    results = asyncio.run(go())
    assert [len(r.token_ids) for r in results] == [6] * 7
    victim = fired(fault_dir, "crash_prefill")[0]
    wait_for(lambda: alive(cluster)[victim], 60, f"{victim} to rejoin")
    assert_clean(cluster)


def test_a_step_three_times_the_worker_timeout_is_busy_not_dead(cluster, fault_dir):
    """A worker inside one long step (as a long prompt's prefill on CPU) keeps its requests: no death is logged,
    every worker stays alive, the request and those beside it finish."""
    seen = len(cluster.log_path.read_text(errors="replace"))
    (fault_dir / "slow_step").write_text(f"406 {3 * WORKER_TIMEOUT}")

    async def go():
        async with AsyncClient(cluster.address, timeout=120, auth_token=TOKEN) as c:
            return await asyncio.gather(*(c.generate(prompt(f), max_tokens=6, **GREEDY) for f in (406, 30, 31)))

    start = time.monotonic()
    results = asyncio.run(go())
    assert [len(r.token_ids) for r in results] == [6] * 3 and fired(fault_dir, "slow_step")
    assert time.monotonic() - start >= 3 * WORKER_TIMEOUT, "the slow step ran"
    log = cluster.log_path.read_text(errors="replace")[seen:]
    assert "busy in one step" in log and "stopped answering" not in log and "requests it lost" not in log, log
    assert all(alive(cluster).values())
    assert_clean(cluster)


@pytest.mark.parametrize("fault, code, marker", [
    ("kv_send_error", P.ABORTED, 403),
    ("kv_corrupt", P.ABORTED, 404),
    ("kv_drop", P.TIMEOUT, 405),
])
def test_a_failed_kv_transfer_ends_that_request_only(cluster, fault_dir, fault, code, marker):
    """The request gets an error (never a silent recompute), the blocks are freed on both sides, the
    requests around it are served."""
    arm(fault_dir, fault, marker)

    async def go():
        async with AsyncClient(cluster.address, timeout=60, auth_token=TOKEN) as c:
            return await asyncio.gather(*(c.generate(prompt(f), max_tokens=4, **GREEDY) for f in (marker, 20, 21)),
                                        return_exceptions=True)

    start = time.monotonic()
    doomed, *fine = asyncio.run(go())
    assert isinstance(doomed, ServerError) and doomed.code == code, doomed
    assert all(len(r.token_ids) == 4 for r in fine), fine
    assert fired(fault_dir, fault)
    if fault == "kv_drop":
        assert time.monotonic() - start < HANDOFF_TIMEOUT + 10
    start = time.monotonic()
    assert_clean(cluster)
    if fault != "kv_drop":  # freed at once on both sides, not when a lease runs out
        assert time.monotonic() - start < HANDOFF_TIMEOUT - 1


# --- placement -----------------------------------------------------------------------------------


def test_requests_sharing_a_prefix_are_prefilled_where_it_is_cached(cluster):
    """Prefix-aware placement over the 2 prefill workers: after one request warms a worker's cache with a system
    prompt, requests sharing it (sent at once) all go there and find it cached; the other worker sees none.
    (With --placement load they spread over both, and those on the other worker find nothing.)"""
    system = [(i * 13) % 290 + 5 for i in range(96)]

    def hits() -> dict[str, int]:
        with cluster.client() as c:
            return {w.worker_id: w.prefix_hit_tokens for w in c.stats(timeout=10).workers if w.role == "prefill"}

    async def go(suffixes):
        async with AsyncClient(cluster.address, timeout=120, auth_token=TOKEN) as c:
            return await asyncio.gather(*(c.generate(system + s, max_tokens=3, **GREEDY) for s in suffixes))

    asyncio.run(go([[7, 8, 9]]))
    time.sleep(1.5)  # the heartbeats carry the engines' counts
    before = hits()
    results = asyncio.run(go([[20 + i, 30 + i, 40 + i, 50 + i] for i in range(4)]))
    assert all(r.usage.cached_tokens >= 80 for r in results), [r.usage for r in results]
    time.sleep(1.5)
    gained = {w: n - before[w] for w, n in hits().items()}
    assert sorted(gained.values())[0] == 0 and sorted(gained.values())[1] >= 4 * 80, gained
    with cluster.client() as c:
        totals = c.stats(timeout=10).totals
    assert 0 < totals.cached_tokens < totals.prompt_tokens
    assert_clean(cluster)


# --- overload ------------------------------------------------------------------------------------


def test_ten_times_capacity_for_a_few_seconds(cluster):
    """Closed-loop clients keep 10x capacity outstanding for 4 s: the router's queue stays bounded, every
    request is answered (a result or `overloaded` with a retry hint), and throughput recovers."""
    users, duration = 10 * CAPACITY, 4.0

    async def batch(c, n: int) -> float:
        start = time.monotonic()
        results = await asyncio.gather(*(c.generate(prompt(30 + i % 50), max_tokens=4, **GREEDY) for i in range(n)))
        assert all(len(r.token_ids) == 4 for r in results)
        return n / (time.monotonic() - start)

    async def go():
        outcomes: list[object] = []
        peaks = {"queued": 0, "in_flight": 0}
        async with AsyncClient(cluster.address, timeout=120, auth_token=TOKEN) as c:
            before = await batch(c, MAX_QUEUED)
            deadline = time.monotonic() + duration

            async def user(u: int) -> None:
                while time.monotonic() < deadline:
                    try:
                        outcomes.append(await c.generate(prompt(30 + u % 50), max_tokens=4, **GREEDY))
                    except ServerError as e:
                        outcomes.append(e)
                        await asyncio.sleep(0.02)  # an impatient client: far less than retry_after

            async def watch() -> None:
                async with AsyncClient(cluster.address, timeout=30, auth_token=TOKEN) as s:
                    while time.monotonic() < deadline + 1:
                        stats = await s.stats()
                        peaks["queued"] = max(peaks["queued"], stats.queued_requests)
                        peaks["in_flight"] = max(peaks["in_flight"], stats.requests_in_flight)
                        await asyncio.sleep(0.1)

            await asyncio.wait_for(asyncio.gather(watch(), *(user(u) for u in range(users))), duration + 90)
            after = await batch(c, MAX_QUEUED)
        return outcomes, peaks, before, after

    outcomes, peaks, before, after = asyncio.run(go())
    errors = [o for o in outcomes if isinstance(o, ServerError)]
    results = [o for o in outcomes if not isinstance(o, ServerError)]
    assert len(outcomes) >= users  # every submission ended (gather returned): a result or an error
    assert results and errors
    assert {e.code for e in errors} == {P.OVERLOADED}, {e.code for e in errors}
    assert all(e.retry_after == pytest.approx(0.2) for e in errors)
    assert peaks["queued"] <= MAX_QUEUED and peaks["in_flight"] <= CAPACITY, peaks
    assert after > before / 4, (before, after)  # recovered (a loose bound: CI machines are noisy)
    assert_clean(cluster)


# --- bad input -----------------------------------------------------------------------------------

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=10)
    | st.binary(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
submit_like = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 2]), "type": st.just("submit"), "request_id": st.just("fuzz")},
    optional={"prompt": junk, "token_ids": st.lists(st.integers(-5, 2**32), max_size=5) | junk,
              "sampling": st.fixed_dictionaries({}, optional={k: junk | st.floats() for k in
                                                              ("max_tokens", "temperature", "top_p", "top_k", "seed")}),
              "stream": junk, "extra": junk},
).map(msgpack.packb)
frames = st.binary(max_size=200) | junk.map(msgpack.packb) | submit_like


@pytest.fixture(scope="module")
def fuzz_socket(cluster):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    auth.secure_client(sock, auth.keys_from_token(TOKEN))
    sock.connect(cluster.address)
    yield sock
    sock.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(frame=frames)
def test_fuzzed_frames_each_get_one_error_and_the_cluster_keeps_serving(cluster, fuzz_socket, frame):
    try:
        P.decode(frame, expect=P.CLIENT_TO_ROUTER)
    except P.ProtocolError as expected:
        fuzz_socket.send(frame)
        assert fuzz_socket.poll(10_000), "no answer to a bad frame"
        reply = P.decode(fuzz_socket.recv(), expect=P.ROUTER_TO_CLIENT)
        assert isinstance(reply, P.Error) and reply.code == expected.code, (reply, expected)
        assert reply.request_id == expected.request_id
    else:
        return  # a valid message: the other tests cover those


def test_after_the_fuzzing_the_cluster_still_serves(cluster, fuzz_socket):
    assert not fuzz_socket.poll(500), "more than one answer to some frame"
    with cluster.client(timeout=60) as c:
        assert len(c.generate(prompt(40), max_tokens=5, **GREEDY).token_ids) == 5
        for bad in ([1, 2, 512], [0] * 5000):  # outside the vocabulary; longer than max_model_len
            with pytest.raises(ServerError) as e:
                c.generate(bad, max_tokens=2)
            assert e.value.code == P.BAD_REQUEST
    assert_clean(cluster)


# --- the end ---------------------------------------------------------------------------------------


def test_sigterm_answers_open_requests_and_leaves_no_process(cluster):
    with cluster.client(timeout=60) as c:
        stream = c.stream(prompt(50), max_tokens=100_000, **GREEDY)
        next(stream)
        cluster.proc.send_signal(signal.SIGTERM)
        with pytest.raises(ServerError) as e:
            for _ in stream:
                pass
        assert e.value.code == P.UNAVAILABLE
    assert cluster.proc.wait(timeout=90) == 0
    wait_for(lambda: not cluster.orphans(), 10, f"the process group to exit: {cluster.orphans()}")
