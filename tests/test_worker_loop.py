"""A worker's loop in this process, on CPU, behind a bare ROUTER socket standing in for the router.

On a GPU the engine's launch clock makes the loop wait before most steps (late launch); on CPU it never
does. Here the engine is told to wait 3 ms after every step, as a GPU worker would: the loop must keep
taking messages while it waits, step when the wait is over, and serve the same tokens.
"""
from __future__ import annotations

import threading
import time

import pytest
import zmq

from common import protocol as P
from common.config import EngineConfig
from common.engine.llm import LLM
from common.sampling_params import SamplingParams
from common.worker.runtime import ColocatedWorker, WorkerConfig

WAIT_S = 0.003
PROMPTS = [[1, 2, 3, 4, 5], list(range(10, 40)), [7] * 17]
SAMPLING = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture
def router():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, f"tcp://127.0.0.1:{port}"
    sock.close()
    ctx.term()


def receive(sock: zmq.Socket, timeout_s: float = 30.0) -> tuple[bytes, P.Message]:
    assert sock.poll(int(timeout_s * 1e3)), "the worker went quiet"
    identity, frame = sock.recv_multipart()
    return identity, P.decode(frame, expect=P.WORKER_TO_ROUTER)


def test_a_worker_that_waits_before_its_steps_serves_the_same_tokens(tiny_qwen3_dir, router):
    sock, address = router
    engine_config = dict(device="cpu", kv_cache_memory=64 << 20)
    llm = LLM(str(tiny_qwen3_dir), **engine_config)
    try:
        expected = [o.token_ids for o in llm.generate(PROMPTS, SAMPLING, use_tqdm=False)]
    finally:
        llm.close()

    worker = ColocatedWorker(WorkerConfig(worker_id="c0", router_address=address),
                             EngineConfig(model=str(tiny_qwen3_dir), **engine_config))
    engine, step = worker.engine, worker.engine.step
    last_step_end = [0.0]
    waits: list[float] = []

    def timed_step(**kw):
        waits.append(time.perf_counter() - last_step_end[0])
        try:
            return step(**kw)
        finally:
            last_step_end[0] = time.perf_counter()

    engine.step = timed_step
    engine.launch_delay = lambda: max(0.0, last_step_end[0] + WAIT_S - time.perf_counter())
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        identity, hello = receive(sock)
        assert isinstance(hello, P.WorkerHello)
        for i, ids in enumerate(PROMPTS):
            sock.send_multipart([identity, P.encode(P.GenerateTask(request_id=f"r{i}", token_ids=ids,
                                                                   sampling=SAMPLING))])
        tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(len(PROMPTS))}
        finished: set[str] = set()
        pongs = 0
        while len(finished) < len(PROMPTS):
            _, msg = receive(sock)
            if isinstance(msg, P.TokenBatch):
                for u in msg.updates:
                    tokens[u.request_id] += u.token_ids
                    if u.finish_reason is not None:
                        finished.add(u.request_id)
                if pongs == 0:  # a ping while it decodes is answered between steps, not after them all
                    sock.send_multipart([identity, P.encode(P.Ping(nonce=7))])
                    pongs = -1
            elif isinstance(msg, P.Pong):
                pongs = 1
        assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == expected
        assert pongs == 1
        assert len(waits) >= SAMPLING.max_tokens and min(waits[1:]) >= WAIT_S * 0.9  # it waited before each step
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_liveness_speaks_while_a_step_runs_long_and_not_between_steps(router):
    """Busy is not dead: while the loop is inside one step past the heartbeat interval, the liveness thread sends
    `alive` on its own connection, with how long the step has run; between steps it leaves heartbeats to the loop."""
    from common.worker.liveness import Liveness

    sock, address = router
    ctx = zmq.Context()
    liveness = Liveness(ctx, "w0", address, interval=0.05)
    liveness.start()
    try:
        time.sleep(0.3)  # no step: nothing
        assert not sock.poll(0)
        liveness.step_started()
        time.sleep(0.5)  # one step, ten intervals long
        liveness.step_ended()
        time.sleep(0.2)
        got = []
        while sock.poll(0):
            got.append(sock.recv_multipart())
        assert len(got) >= 5
        assert all(identity == P.liveness_identity("w0") for identity, _ in got)
        busy = [P.decode(frame, expect=P.WORKER_TO_ROUTER).busy_seconds for _, frame in got]
        assert busy == sorted(busy) and busy[0] >= 0.05 and busy[-1] <= 0.6
    finally:
        liveness.stop()
        ctx.term()


def test_messages_are_taken_while_the_gpu_runs_a_step(tiny_qwen3_dir, router):
    """The loop hands the engine an `idle` that takes messages while it waits for a step's tokens: a ping sent
    while a step is in progress is answered before that step ends. (On CPU a step never waits for a device: the
    stand-in step below waits as a GPU step would, calling `idle` until the pong is out, at most 5 s.)"""
    sock, address = router
    worker = ColocatedWorker(WorkerConfig(worker_id="c0", router_address=address),
                             EngineConfig(model=str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20))
    step = worker.engine.step
    inside, answered, idles = threading.Event(), threading.Event(), [0]

    class Running:  # the step's CUDA event, stood in for: the step runs until the pong is out (at most 5 s)
        deadline = time.monotonic() + 5

        def query(self):
            return answered.is_set() or time.monotonic() > self.deadline

        def synchronize(self):
            answered.wait(5)

    def gpu_like_step(idle=None, **kw):
        inside.set()
        event = Running()
        while idle is not None and not event.query():
            idles[0] += 1  # counted before the call: the pong it sends may be read before the call returns
            idle(event)
        inside.clear()
        return step(idle=idle, **kw)

    worker.engine.step = gpu_like_step
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        identity, hello = receive(sock)
        assert isinstance(hello, P.WorkerHello)
        sock.send_multipart([identity, P.encode(P.GenerateTask(request_id="r0", token_ids=PROMPTS[0],
                                                               sampling=SAMPLING))])
        assert inside.wait(10)
        sock.send_multipart([identity, P.encode(P.Ping(nonce=11))])
        while True:
            _, msg = receive(sock)
            if isinstance(msg, P.Pong):
                break
        pong_inside_step = inside.is_set()
        answered.set()
        assert msg.nonce == 11 and pong_inside_step and idles[0] > 0
    finally:
        worker.stop()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_collecting_a_step_calls_idle_until_its_tokens_are_there():
    import torch

    from common.engine.in_flight import InFlight

    class Event:  # done on its third query
        queries = 0

        def query(self):
            self.queries += 1
            return self.queries >= 3

        def synchronize(self):
            assert self.queries >= 3, "synchronized before the event was done"

    calls = []
    event = Event()
    assert InFlight(torch.tensor([5, 6]), None, event).tokens(calls.append) == [5, 6]
    assert calls == [event, event]  # told what it waits for
