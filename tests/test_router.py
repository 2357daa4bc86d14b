"""The router's bookkeeping against in-process fake workers: worker faults, overload and bad input, no Ray.

`Sim` stands in for the workers (and the KV data plane between them) and records what every client
was told. Each scenario below is one fault of docs/reliability.md; the hypothesis test at the end
drives random mixes of them and checks that nothing is lost and nothing hangs.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import protocol as P
from common.sampling_params import SamplingParams
from router.admission import WaitQueue
from router.client.results import readiness_problem
from router.config import RouterConfig
from router.request import Request
from router.request_table import RequestTable
from router.router import Router
from router.text import RouterText
from tests.cluster_harness import free_port

BLOCK = 16
LAYOUT = P.KVLayout(block_size=BLOCK, num_layers=2, num_kv_heads=2, head_dim=32, dtype="float32")
VOCAB = 512
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def make_router(tiny_qwen3_dir):
    text = RouterText.load(str(tiny_qwen3_dir))  # one load for the whole module
    routers: list[Router] = []

    def make(**config) -> Router:
        router = Router(RouterConfig(model=str(tiny_qwen3_dir), bind=f"tcp://127.0.0.1:{free_port()}", **config), text)
        routers.append(router)
        return router

    yield make
    for router in routers:
        router.close()


# --- fake workers --------------------------------------------------------------------------------


@dataclass
class FakeWorker:
    worker_id: str
    role: str
    num_blocks: int = 64
    state: str = "up"  # up; stalled (alive, silent: a long step); dead (the process is gone)
    inbox: list = field(default_factory=list)
    blocks: dict = field(default_factory=dict)  # decode: rid -> blocks held (reserved or running)
    running: dict = field(default_factory=dict)  # decode/colocated: rid -> tokens still to generate
    handoffs: list = field(default_factory=list)  # decode: (rid, max_tokens) whose KV arrived
    tasks: list = field(default_factory=list)  # prefill: PrefillTask queue
    fail_next_handoff: str | None = None  # prefill: "aborted" (transfer error) or "timeout" (lost)

    @property
    def free(self) -> int:
        return self.num_blocks - sum(self.blocks.values())

    def forget_everything(self) -> None:
        self.inbox, self.blocks, self.running, self.handoffs, self.tasks = [], {}, {}, [], []


def hello(w: FakeWorker) -> P.WorkerHello:
    return P.WorkerHello(worker_id=w.worker_id, role=w.role, model_fingerprint="fake", num_blocks=w.num_blocks,
                         layout=LAYOUT, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB, transports=["host"],
                         kv_address=f"inproc://{w.worker_id}")


class Sim:
    def __init__(self, router: Router, *workers: FakeWorker):
        self.router = router
        self.workers = {w.worker_id: w for w in workers}
        self.replies: dict[str, list[P.Message]] = defaultdict(list)  # client request id -> what it got
        self.submitted: dict[str, tuple[bool, int]] = {}  # client request id -> (stream, max_tokens)
        self.next_token = 100
        self.sent: list[tuple[str, P.Message]] = []  # (worker id, message), everything the router sent workers
        router.to_client = self._to_client
        router.to_worker = self._to_worker

    async def _to_client(self, identity: bytes, msg: P.Message) -> None:
        self.replies[getattr(msg, "request_id", "")].append(msg)

    async def _to_worker(self, info, msg: P.Message) -> None:
        worker = self.workers[info.worker_id]
        self.sent.append((info.worker_id, msg))
        if worker.state != "dead":
            worker.inbox.append(msg)

    async def send(self, w: FakeWorker, msg: P.Message) -> None:
        if w.state == "up":
            await self.router.on_worker(w.worker_id.encode(), msg)

    async def start(self) -> Sim:
        for w in self.workers.values():
            await self.router.on_worker(w.worker_id.encode(), hello(w))
            await self.heartbeat(w)
        return self

    async def heartbeat(self, w: FakeWorker) -> None:
        await self.send(w, P.Heartbeat(worker_id=w.worker_id, load=P.WorkerLoad(
            queued_requests=len(w.tasks), queued_tokens=0, running_requests=len(w.running),
            kv_blocks_total=w.num_blocks, kv_blocks_free=w.free)))

    async def submit(self, rid: str, prompt_len: int = 20, max_tokens: int = 4, stream: bool = False,
                     token_ids: list[int] | None = None, migrate: bool = True) -> list[P.Message]:
        self.submitted[rid] = (stream, max_tokens)
        ids = token_ids if token_ids is not None else [1 + i % 300 for i in range(prompt_len)]
        await self.router.on_client(b"client", P.Submit(request_id=rid, token_ids=ids, stream=stream,
                                                        sampling=SamplingParams(max_tokens=max_tokens),
                                                        migrate=migrate))
        return self.replies[rid]

    async def abort(self, rid: str) -> None:
        await self.router.on_client(b"client", P.Abort(request_id=rid))

    # -- faults
    async def kill(self, w: FakeWorker) -> None:
        w.state = "dead"
        w.forget_everything()

    async def expire(self) -> None:
        """The router's housekeeping, as if `worker_timeout` had passed for every silent worker."""
        for w in self.workers.values():
            if w.state != "up":
                self.router.registry.workers[w.worker_id].last_seen = -1e9
        for info in self.router.registry.expire(self.router.config.worker_timeout):
            await self.router.on_worker_lost(info, "stopped answering")
        await self.router.dispatch()

    async def revive(self, w: FakeWorker) -> None:
        """A dead worker's process is started again (hello); a stalled one resumes (heartbeat)."""
        if w.state == "dead":
            w.state = "up"
            await self.send(w, hello(w))
        w.state = "up"
        await self.heartbeat(w)

    # -- progress
    def _token(self) -> int:
        self.next_token = 100 + (self.next_token - 99) % 300
        return self.next_token

    async def step(self, w: FakeWorker) -> bool:
        """Handle the inbox, make one step of progress, heartbeat. True if anything happened."""
        if w.state != "up":
            return False
        inbox, w.inbox = w.inbox, []
        busy = bool(inbox or w.tasks or w.running or w.handoffs)
        for msg in inbox:
            await self._handle(w, msg)
        if w.role == "prefill" and w.tasks:
            await self._hand_off(w, w.tasks.pop(0))
        updates = []
        for rid, max_tokens in w.handoffs:
            if rid in w.blocks and rid not in w.running:
                w.running[rid] = max_tokens
        w.handoffs = []
        for rid in list(w.running):
            w.running[rid] -= 1
            done = w.running[rid] == 0
            updates.append(P.TokenUpdate(request_id=rid, token_ids=[self._token()],
                                         finish_reason="length" if done else None))
            if done:
                del w.running[rid]
                w.blocks.pop(rid, None)
        if updates:
            await self.send(w, P.TokenBatch(updates=updates))
        await self.heartbeat(w)
        return busy

    async def _handle(self, w: FakeWorker, msg: P.Message) -> None:
        if isinstance(msg, P.Reserve):
            need = -(-(len(msg.token_ids) + 1) // BLOCK)
            if need > w.free:
                await self.send(w, P.Error(request_id=msg.request_id, code=P.OVERLOADED, message="full",
                                           retry_after=0.05))
            else:
                w.blocks[msg.request_id] = need
                await self.send(w, P.Reserved(request_id=msg.request_id, block_ids=list(range(need))))
        elif isinstance(msg, P.PrefillTask):
            w.tasks.append(msg)
        elif isinstance(msg, P.GenerateTask):
            w.blocks[msg.request_id] = 1
            w.running[msg.request_id] = msg.sampling.max_tokens
        elif isinstance(msg, P.AbortRequest):
            w.blocks.pop(msg.request_id, None)
            w.running.pop(msg.request_id, None)
            w.tasks = [t for t in w.tasks if t.request_id != msg.request_id]

    async def _hand_off(self, w: FakeWorker, task: P.PrefillTask) -> None:
        fault, w.fail_next_handoff = w.fail_next_handoff, None
        decode = self.workers[task.decode_worker_id]
        if fault == "aborted":
            await self.send(w, P.Error(request_id=task.request_id, code=P.ABORTED, message="KV transfer failed"))
        elif fault == "timeout" or decode.state == "dead":  # the prefill worker's lease runs out
            await self.send(w, P.Error(request_id=task.request_id, code=P.TIMEOUT, message="KV handoff timed out"))
        else:
            decode.handoffs.append((task.request_id, task.sampling.max_tokens))

    async def drain(self, rounds: int = 300) -> None:
        """Every worker back up, then steps until nothing moves."""
        for w in self.workers.values():
            if w.state != "up":
                await self.revive(w)
        for _ in range(rounds):
            busy = False
            for w in self.workers.values():
                busy |= await self.step(w)
            await self.router.dispatch()
            if not busy and not self.router.queue:
                return
        raise AssertionError("the cluster did not settle")

    # -- what the clients saw
    def terminal(self, rid: str) -> P.Message:
        msgs = self.replies[rid]
        assert msgs and isinstance(msgs[-1], (P.Result, P.Error)), msgs
        return msgs[-1]

    def check_clean(self) -> None:
        """Nothing lost, nothing stuck: one terminal reply per request, all state released."""
        for rid, (stream, max_tokens) in self.submitted.items():
            msgs = self.replies[rid]
            terminals = [m for m in msgs if isinstance(m, (P.Result, P.Error))]
            assert len(terminals) == 1 and msgs[-1] is terminals[0], (rid, msgs)
            deltas = [m for m in msgs if isinstance(m, P.Delta)]
            assert stream or not deltas
            result = terminals[0]
            if isinstance(result, P.Result):
                if stream:
                    assert [t for d in deltas for t in d.token_ids] == result.token_ids
                    assert [d.index for d in deltas if d.token_ids] == list(range(len(result.token_ids)))
                if result.finish_reason == "length":
                    assert len(result.token_ids) == max_tokens  # a restart never duplicates tokens
            else:
                assert result.code in (P.ABORTED, P.TIMEOUT, P.OVERLOADED, P.UNAVAILABLE), result
        r = self.router
        assert not r.requests and len(r.queue) == 0 and r.queue.tokens == 0
        for info in r.registry.workers.values():
            assert not info.assigned and info.prefill_tokens == 0, info
        for w in self.workers.values():
            assert not w.blocks and not w.running and not w.tasks, w


def disagg(make_router, prefill: int = 2, decode: int = 2, num_blocks: int = 64, **config) -> Sim:
    workers = [FakeWorker(f"p{i}", "prefill", num_blocks) for i in range(prefill)]
    workers += [FakeWorker(f"d{i}", "decode", num_blocks) for i in range(decode)]
    return Sim(make_router(**config), *workers)


def run(coro):
    return asyncio.run(coro)


def where(sim: Sim, rid: str):
    req = sim.router.requests.of_client(b"client", rid)
    return sim.workers[req.prefilled_on] if req.prefilled_on else None, sim.workers[req.decode.worker_id]


# --- worker faults -------------------------------------------------------------------------------


def test_decode_death_restarts_unseen_requests_migrates_streamed_ones_and_aborts_opted_out(make_router):
    async def main():
        sim = await disagg(make_router, decode=1).start()
        d0 = sim.workers["d0"]
        await sim.submit("quiet", max_tokens=8)
        await sim.submit("loud", max_tokens=8, stream=True)
        await sim.submit("stay", max_tokens=8, stream=True, migrate=False)
        for _ in range(4):
            for w in sim.workers.values():
                await sim.step(w)
        assert d0.running.keys() == {r.rid for r in sim.router.requests} and len(d0.running) == 3
        loud_before = [t for m in sim.replies["loud"] for t in m.token_ids]
        assert 0 < len(loud_before) < 8
        d1 = sim.workers["d1"] = FakeWorker("d1", "decode")  # a second decode worker joins
        await sim.send(d1, hello(d1))
        await sim.kill(d0)
        await sim.submit("bystander", max_tokens=8)  # before the router notices: lands on d1 (more free blocks)
        await sim.expire()
        assert {w.worker_id: w.alive for w in sim.router.stats().workers}["d0"] is False
        await sim.drain()
        sim.check_clean()
        quiet = sim.terminal("quiet")
        assert isinstance(quiet, P.Result) and len(quiet.token_ids) == 8  # started over, finished on d1
        loud = sim.terminal("loud")  # the client had seen tokens: it goes on where it stopped, on d1
        assert isinstance(loud, P.Result) and loud.token_ids[:len(loud_before)] == loud_before
        prompt = [1 + i % 300 for i in range(20)]
        resumed = [m for w, m in sim.sent if w == "d1" and isinstance(m, P.Reserve)
                   and m.token_ids[:20] == prompt and len(m.token_ids) > 20]
        assert len(resumed) == 1 and resumed[0].token_ids == prompt + loud_before  # the prompt and what it streamed
        assert resumed[0].sampling.max_tokens == 8 - len(loud_before)
        assert sim.router.stats().totals.migrations == 1
        stay = sim.terminal("stay")  # opted out: a clear error, not a silent restart
        assert isinstance(stay, P.Error) and stay.code == P.ABORTED and stay.retry_after is not None
        assert "decode worker d0" in stay.message
        assert isinstance(sim.terminal("bystander"), P.Result)

    run(main())


def test_a_stream_too_long_for_the_workers_left_is_aborted_not_moved(make_router):
    """Its prompt and tokens need more KV blocks than the decode worker left has: moved, it would wait at the head
    of the queue forever."""
    async def main():
        big, small = FakeWorker("d0", "decode", num_blocks=64), FakeWorker("d1", "decode", num_blocks=8)
        sim = await Sim(make_router(), FakeWorker("p0", "prefill"), big, small).start()
        await sim.submit("long", prompt_len=120, max_tokens=30, stream=True)  # 8 blocks now, 9 after 8 tokens
        while len(sim.replies["long"]) < 10:
            for w in sim.workers.values():
                await sim.step(w)
        assert where(sim, "long")[1] is big
        await sim.kill(big)
        await sim.expire()
        await sim.drain()
        sim.check_clean()
        long = sim.terminal("long")
        assert isinstance(long, P.Error) and long.code == P.ABORTED
        assert sim.router.stats().totals.migrations == 0

    run(main())


def test_a_colocated_replica_dying_mid_stream_moves_its_streams_to_another(make_router):
    async def main():
        c0, c1 = FakeWorker("c0", "colocated"), FakeWorker("c1", "colocated")
        sim = await Sim(make_router(mode="colocated"), c0, c1).start()
        for i in range(4):
            await sim.submit(f"s{i}", max_tokens=10, stream=True)
        while not all(sim.replies[f"s{i}"] for i in range(4)):
            for w in sim.workers.values():
                await sim.step(w)
        await sim.kill(c0)
        await sim.expire()
        await sim.drain()
        sim.check_clean()  # each stream whole: 10 tokens, indices 0..9
        assert all(isinstance(sim.terminal(f"s{i}"), P.Result) for i in range(4))
        moved = [m for w, m in sim.sent if w == "c1" and isinstance(m, P.GenerateTask) and len(m.token_ids) > 20]
        assert moved and sim.router.stats().totals.migrations == len(moved)
        assert all(m.sampling.max_tokens == 10 - (len(m.token_ids) - 20) for m in moved)

    run(main())


def test_prefill_death_reassigns_its_queued_requests_and_spares_decoding_ones(make_router):
    async def main():
        sim = await disagg(make_router).start()
        await sim.submit("decoding", max_tokens=6, stream=True)
        for _ in range(3):
            for w in sim.workers.values():
                await sim.step(w)
        assert sim.replies["decoding"], "tokens are flowing"
        victim, _ = where(sim, "decoding")
        for i in range(4):
            await sim.submit(f"queued{i}", max_tokens=3)
        for w in sim.workers.values():
            if w.role == "decode":
                await sim.step(w)  # reserved: the prompts go to the prefill workers
        queued_on_victim = [t for t in victim.inbox if isinstance(t, P.PrefillTask)]
        assert queued_on_victim
        await sim.kill(victim)
        await sim.expire()
        await sim.drain()
        sim.check_clean()
        assert isinstance(sim.terminal("decoding"), P.Result), "a prefill death does not touch decoding requests"
        for i in range(4):
            result = sim.terminal(f"queued{i}")
            assert isinstance(result, P.Result) and len(result.token_ids) == 3

    run(main())


def test_a_request_is_started_over_at_most_request_restarts_times(make_router):
    async def main():
        sim = await disagg(make_router, request_restarts=1).start()
        await sim.submit("unlucky", max_tokens=50)
        for _ in range(3):
            for w in sim.workers.values():
                await sim.step(w)
        for _ in range(2):  # its decode worker dies, then the next one too
            _, decode = where(sim, "unlucky")
            await sim.kill(decode)
            await sim.expire()
            for _ in range(3):
                for w in sim.workers.values():
                    await sim.step(w)
        error = sim.terminal("unlucky")
        assert isinstance(error, P.Error) and error.code == P.ABORTED
        await sim.drain()
        sim.check_clean()

    run(main())


def test_a_worker_declared_dead_that_speaks_again_drops_what_it_lost(make_router):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=1).start()
        d0 = sim.workers["d0"]
        await sim.submit("a", max_tokens=20, stream=True, migrate=False)
        for _ in range(3):
            for w in sim.workers.values():
                await sim.step(w)
        d0.state = "stalled"  # e.g. one very long step: heartbeats stop
        await sim.expire()
        assert isinstance(sim.terminal("a"), P.Error)
        assert sim.router.registry.workers["d0"].lost
        assert "a" in sim.replies and d0.running  # the stalled worker still holds the request
        await sim.revive(d0)  # its next heartbeat
        assert sim.router.registry.workers["d0"].alive and not sim.router.registry.workers["d0"].lost
        assert [type(m) for m in d0.inbox] == [P.AbortRequest]
        await sim.step(d0)
        assert d0.free == d0.num_blocks
        await sim.submit("b", max_tokens=3)  # and it serves again
        await sim.drain()
        sim.check_clean()
        assert isinstance(sim.terminal("b"), P.Result)

    run(main())


def test_a_restarted_worker_rejoins_under_its_id_and_its_old_requests_move(make_router):
    async def main():
        sim = await disagg(make_router, decode=1).start()
        await sim.submit("x", max_tokens=5)
        for _ in range(3):
            for w in sim.workers.values():
                await sim.step(w)
        d0 = sim.workers["d0"]
        await sim.kill(d0)
        await sim.revive(d0)  # restarted before the router noticed: its hello says so
        info = sim.router.registry.workers["d0"]
        assert info.alive and not info.lost
        await sim.drain()
        sim.check_clean()
        result = sim.terminal("x")
        assert isinstance(result, P.Result) and len(result.token_ids) == 5

    run(main())


def test_workers_meeting_open_their_kv_links_and_the_cluster_is_ready_once_they_answer(make_router):
    """As a prefill and a decode worker meet (either says hello), the router has the prefill worker open its KV
    link to the decode worker, and counts it opening until the prefill worker answers; a failed one is logged and
    not counted as opened, and a worker that dies takes its unanswered links with it."""
    async def main():
        sim = await disagg(make_router, prefill=2, decode=1).start()
        opens = [(w, m.decode_worker_id) for w, m in sim.sent if isinstance(m, P.OpenLink)]
        assert sorted(opens) == [("p0", "d0"), ("p1", "d0")]
        assert all(m.transport == "host" and m.decode_kv_address == "inproc://d0"
                   for _, m in sim.sent if isinstance(m, P.OpenLink))
        stats = sim.router.stats()
        assert stats.kv_links_opening == 2
        assert readiness_problem(stats) == "2 KV links between prefill and decode workers still opening"
        p0, p1 = sim.workers["p0"], sim.workers["p1"]
        await sim.send(p0, P.LinkOpened(decode_worker_id="d0"))
        await sim.send(p1, P.LinkOpened(decode_worker_id="d0", error="timed out"))
        await sim.send(p1, P.LinkOpened(decode_worker_id="d0"))  # answered already: counted once
        stats = sim.router.stats()
        assert (stats.kv_links_opening, stats.totals.kv_links_opened) == (0, 1) and readiness_problem(stats) is None
        d1 = FakeWorker("d1", "decode")
        sim.workers["d1"] = d1
        await sim.router.on_worker(b"d1", hello(d1))
        assert sorted([(w, m.decode_worker_id) for w, m in sim.sent if isinstance(m, P.OpenLink)][2:]) == [
            ("p0", "d1"), ("p1", "d1")]
        assert sim.router.stats().kv_links_opening == 2
        await sim.router.on_worker_lost(sim.router.registry.workers["d1"], "died")
        assert sim.router.stats().kv_links_opening == 0
        d2 = FakeWorker("d2", "decode")
        sim.workers["d2"] = d2
        await sim.router.on_worker(b"d2", hello(d2))
        assert sim.router.stats().kv_links_opening == 2
        sim.router.registry.forget("d2")  # removed by scaling before its links answered
        assert sim.router.stats().kv_links_opening == 0
        await sim.submit("x", max_tokens=3)
        await sim.drain()
        assert isinstance(sim.terminal("x"), P.Result)

    run(main())


def test_beyond_the_eager_limit_a_pairs_first_handoff_opens_its_link(make_router):
    """Every pair ahead is prefill x decode links: past --eager-kv-links pairs the workers that join open none, the
    cluster is ready without them, and their requests are served (a pair's first handoff opens its link)."""
    async def main():
        sim = await disagg(make_router, prefill=2, decode=2, eager_kv_links=2).start()
        opens = sorted((w, m.decode_worker_id) for w, m in sim.sent if isinstance(m, P.OpenLink))
        assert opens == [("p0", "d0"), ("p1", "d0")]  # p0, p1, d0 make 2 pairs; d1 would make 4
        for p in ("p0", "p1"):
            await sim.send(sim.workers[p], P.LinkOpened(decode_worker_id="d0"))
        assert readiness_problem(sim.router.stats()) is None
        for i in range(4):
            await sim.submit(f"r{i}", max_tokens=3)
        await sim.drain()
        assert {w for w, m in sim.sent if isinstance(m, P.Reserve)} == {"d0", "d1"}  # d1 pairs without a link
        assert all(isinstance(sim.terminal(f"r{i}"), P.Result) for i in range(4))
        sim.router.registry.forget("d1")
        d2 = FakeWorker("d2", "decode")
        sim.workers["d2"] = d2
        await sim.router.on_worker(b"d2", hello(d2))  # 2 x 2 again: beyond, none opened
        assert len([m for _, m in sim.sent if isinstance(m, P.OpenLink)]) == 2

    run(main())


def test_colocated_workers_open_no_links(make_router):
    async def main():
        sim = await Sim(make_router(mode="colocated"), FakeWorker("c0", "colocated"),
                        FakeWorker("c1", "colocated")).start()
        assert not [m for _, m in sim.sent if isinstance(m, P.OpenLink)] and sim.router.stats().kv_links_opening == 0

    run(main())


@pytest.mark.parametrize("fault, code", [("aborted", P.ABORTED), ("timeout", P.TIMEOUT)])
def test_a_failed_kv_transfer_ends_the_request_with_an_error_and_frees_both_sides(make_router, fault, code):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=1).start()
        sim.workers["p0"].fail_next_handoff = fault
        await sim.submit("doomed", max_tokens=4)
        await sim.submit("fine", max_tokens=4)
        await sim.drain()
        sim.check_clean()  # the decode worker's reservation was released
        error = sim.terminal("doomed")
        assert isinstance(error, P.Error) and error.code == code
        assert isinstance(sim.terminal("fine"), P.Result)

    run(main())


def test_messages_from_the_wrong_worker_are_ignored(make_router):
    async def main():
        sim = await disagg(make_router).start()
        await sim.submit("r", max_tokens=3)
        rid = sim.router.requests.of_client(b"client", "r").rid
        _, decode = where(sim, "r")
        other = next(w for w in sim.workers.values() if w.role == "decode" and w is not decode)
        await sim.send(other, P.TokenBatch(updates=[P.TokenUpdate(request_id=rid, token_ids=[5],
                                                                  finish_reason="stop")]))
        await sim.send(other, P.Error(request_id=rid, code=P.INTERNAL, message="not mine"))
        assert sim.replies["r"] == []
        sent = []
        sim.router.backend.send_multipart = lambda frames: sent.append(frames) or asyncio.sleep(0)
        await sim.router.on_worker(b"stranger", P.TokenBatch(updates=[P.TokenUpdate(request_id=rid, token_ids=[5])]))
        await sim.router.on_worker(b"stranger", P.Error(request_id="", code=P.INTERNAL, message="x"))
        assert sim.replies["r"] == []
        assert [P.decode(f[1]).code for f in sent] == [P.UNAUTHORIZED]  # and no reply to an error
        await sim.drain()
        sim.check_clean()

    run(main())


def test_stopping_the_router_answers_every_request(make_router):
    async def main():
        sim = await disagg(make_router).start()
        sim.router._broadcast = lambda msg: asyncio.sleep(0)
        for i in range(3):
            await sim.submit(f"r{i}", max_tokens=10, stream=True)
        for w in sim.workers.values():
            await sim.step(w)
        stop = asyncio.Event()
        stop.set()
        sim.router._client_loop = sim.router._worker_loop = sim.router._housekeeping = lambda: asyncio.sleep(0)
        await sim.router.serve(stop)
        for i in range(3):
            error = sim.terminal(f"r{i}")
            assert isinstance(error, P.Error) and error.code == P.UNAVAILABLE
        assert not sim.router.requests and len(sim.router.queue) == 0

    run(main())


def test_housekeeping_notices_a_silent_worker_within_the_timeout(make_router):
    async def main():
        sim = await disagg(make_router, worker_timeout=1.0).start()
        sim.workers["d1"].state = "stalled"
        task = asyncio.create_task(sim.router._housekeeping())
        try:
            for _ in range(40):  # the others keep sending heartbeats, for 2 s
                for w in sim.workers.values():
                    await sim.step(w)
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        alive = {w.worker_id: w.alive for w in sim.router.stats().workers}
        assert alive == {"p0": True, "p1": True, "d0": True, "d1": False}

    run(main())


def test_a_worker_busy_in_one_long_step_is_not_declared_dead(make_router, caplog):
    """Busy is not dead: d1's loop sits in one step three times the timeout, sending no heartbeat, while its liveness
    connection says `alive`; it keeps its requests. d0 goes quiet on both connections and is declared dead."""
    async def main():
        sim = await disagg(make_router, worker_timeout=0.5).start()
        sim.workers["d0"].state = sim.workers["d1"].state = "stalled"
        liveness = P.liveness_identity("d1")
        task = asyncio.create_task(sim.router._housekeeping())
        try:
            for i in range(30):  # 1.5 s: three times the timeout
                for w in (sim.workers["p0"], sim.workers["p1"]):
                    await sim.step(w)
                await sim.router.on_worker(liveness, P.Alive(worker_id="d1", busy_seconds=0.05 * i))
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        alive = {w.worker_id: w.alive for w in sim.router.stats().workers}
        assert alive == {"p0": True, "p1": True, "d0": False, "d1": True}
        assert "d1 is busy in one step" in caplog.text and "d1 stopped answering" not in caplog.text
        # An `alive` naming another worker, or from a connection that is no worker's, counts for nothing.
        await sim.router.on_worker(liveness, P.Alive(worker_id="d0", busy_seconds=1.0))
        await sim.router.on_worker(P.liveness_identity("nobody"), P.Alive(worker_id="d0", busy_seconds=1.0))
        assert not sim.router.registry.workers["d0"].alive

    with caplog.at_level("INFO", logger="router.router"):
        run(main())


def test_the_worker_endpoint_survives_garbage(make_router):
    """A broken frame, a multipart message or a stranger's heartbeat neither stops the worker loop nor
    registers anyone; a proper hello still does."""
    async def main():
        router = make_router()
        loop_task = asyncio.create_task(router._worker_loop())
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, b"w0")
        sock.connect(router.worker_address)
        try:
            w0 = FakeWorker("w0", "decode")
            beat = P.Heartbeat(worker_id="w0", load=P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=0,
                                                                 kv_blocks_total=1, kv_blocks_free=1))
            for frames in ([b"\xc1"], [P.encode(beat), b"x"], [P.encode(P.Ping())[:-1]],
                           [P.encode(P.Abort(request_id="r"))],
                           [P.encode(beat)]):
                await sock.send_multipart(frames)
            reply = P.decode(await asyncio.wait_for(sock.recv(), 5))
            assert reply.code == P.UNAUTHORIZED and not router.registry.workers
            await sock.send(P.encode(hello(w0)))
            for _ in range(100):
                if "w0" in router.registry.workers:
                    break
                await asyncio.sleep(0.02)
            assert router.registry.workers["w0"].alive
        finally:
            loop_task.cancel()
            sock.close()
            ctx.term()

    run(main())


# --- overload ------------------------------------------------------------------------------------


def test_a_full_queue_answers_overloaded_with_a_retry_hint(make_router):
    async def main():
        # One tiny decode worker: a request holds all of its blocks, the rest queue at the router.
        sim = await disagg(make_router, prefill=1, decode=1, num_blocks=2, max_queued_requests=3,
                           max_queued_tokens=60, retry_after=0.5).start()
        for i in range(6):
            await sim.submit(f"r{i}", prompt_len=20, max_tokens=2)
        stats = sim.router.stats()
        assert stats.queued_requests == 3 and stats.requests_in_flight == 4
        for i in (4, 5):
            error = sim.terminal(f"r{i}")
            assert error.code == P.OVERLOADED and error.retry_after == 0.5
        big = await sim.submit("big", prompt_len=100, max_tokens=2)  # 3 + 1 in the queue: 60 tokens, over budget
        assert big == [] or big[-1].code == P.OVERLOADED
        await sim.drain()
        sim.check_clean()
        assert [type(sim.terminal(f"r{i}")) for i in range(4)] == [P.Result] * 4

    run(main())


def test_the_token_budget_bounds_the_queue(make_router):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=1, num_blocks=2, max_queued_tokens=50).start()
        await sim.submit("running", prompt_len=20)  # dispatched: it does not count
        await sim.submit("q1", prompt_len=30)
        await sim.submit("q2", prompt_len=20)  # 50 queued: still fits
        await sim.submit("q3", prompt_len=1)
        assert sim.terminal("q3").code == P.OVERLOADED and sim.router.queue.tokens == 50
        await sim.drain()
        sim.check_clean()

    run(main())


def test_no_worker_gets_more_than_max_worker_requests(make_router):
    async def main():
        router = make_router(mode="colocated", max_worker_requests=3)
        sim = await Sim(router, FakeWorker("c0", "colocated", num_blocks=1000)).start()
        for i in range(10):
            await sim.submit(f"r{i}", max_tokens=2)
        c0 = sim.workers["c0"]
        assert len(c0.inbox) == 3 and sim.router.stats().queued_requests == 7
        await sim.drain()
        sim.check_clean()
        assert all(isinstance(sim.terminal(f"r{i}"), P.Result) for i in range(10))

    run(main())


@pytest.mark.parametrize("setting", [dict(max_worker_requests=0), dict(worker_timeout=0.0), dict(retry_after=-1.0),
                                     dict(max_queued_requests=-1), dict(request_restarts=-1)])
def test_limits_that_would_hang_or_break_every_request_are_refused(make_router, setting):
    with pytest.raises(ValueError, match=next(iter(setting))):
        make_router(**setting)


# --- bad input -----------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    token_ids=st.lists(st.integers(0, P.MAX_TOKEN_ID), min_size=1, max_size=MAX_MODEL_LEN + 20),
    sampling=st.builds(SamplingParams, max_tokens=st.integers(1, 10**9), temperature=st.floats(0, 1e6),
                       top_p=st.floats(1e-9, 1), top_k=st.integers(-1, 10**6),
                       seed=st.none() | st.integers(0, 2**63 - 1),
                       stop_token_ids=st.lists(st.integers(0, 2**40), max_size=20), ignore_eos=st.booleans()),
)
def test_the_request_validator_answers_every_submit(make_router, token_ids, sampling):
    """Any well-formed submit is queued, or refused with bad_request naming the field; the router stays sound."""
    async def main():
        router = shared_router(make_router)
        sim = await Sim(router, FakeWorker("p0", "prefill"), FakeWorker("d0", "decode")).start()
        await router.on_client(b"client", P.Submit(request_id="r", token_ids=token_ids, sampling=sampling))
        replies = sim.replies["r"]
        too_long = len(token_ids) > MAX_MODEL_LEN
        bad_ids = max(token_ids) >= VOCAB
        if too_long or bad_ids:
            assert [m.code for m in replies] == [P.BAD_REQUEST]
            assert ("prompt" if too_long else "token_ids") in replies[0].message
            assert not router.requests
        else:
            assert replies == [] and len(router.requests) == 1
            await sim.abort("r")
            assert sim.terminal("r").finish_reason == "abort"
        await sim.drain()
        assert not router.requests

    run(main())


_SHARED: list[Router] = []


def shared_router(make_router) -> Router:
    if not _SHARED:
        _SHARED.append(make_router())
    router = _SHARED[0]
    router.registry.workers.clear()
    router.registry.identities.clear()
    return router


# --- everything at once --------------------------------------------------------------------------

WORKERS = ["p0", "p1", "d0", "d1"]
KINDS = ["submit"] * 4 + ["step"] * 8 + ["abort", "kill", "stall", "revive", "expire", "kv_fault"]
# (what, a flag, a number, a worker): each kind reads what it needs.
OPS = st.tuples(st.sampled_from(KINDS), st.booleans(), st.integers(0, 10**6), st.sampled_from(WORKERS))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(OPS, min_size=20, max_size=120), st.sampled_from(["always", "never"]))
def test_random_faults_lose_nothing_and_hang_nothing(make_router, ops, policy):
    """Under `--disagg-policy never` the decode workers prefill every prompt themselves."""
    async def main():
        router = shared_router(make_router)
        router.disagg.policy = policy
        router.requests.clear()
        router.admission.queue = WaitQueue()
        router.config.max_queued_requests = 6
        router.config.max_worker_requests = 4
        router.registry.max_requests = 4
        sim = await Sim(router, *(FakeWorker(w, "prefill" if w[0] == "p" else "decode", num_blocks=12)
                                  for w in WORKERS)).start()
        bound = 6 + 4 * 2  # the queue, plus what the decode workers may hold
        names = []
        for kind, flag, n, worker_id in ops:
            w = sim.workers[worker_id]
            if kind == "submit":
                names.append(f"r{len(names)}")
                await sim.submit(names[-1], prompt_len=1 + n % 60, max_tokens=1 + n % 6, stream=flag)
            elif kind == "abort" and names:
                await sim.abort(names[n % len(names)])
            elif kind == "step":
                await sim.step(w)
            elif kind == "kill":
                await sim.kill(w)
            elif kind == "stall" and w.state == "up":
                w.state = "stalled"
            elif kind == "revive":
                await sim.revive(w)
            elif kind == "expire":
                await sim.expire()
            elif kind == "kv_fault" and w.role == "prefill":
                w.fail_next_handoff = "aborted" if flag else "timeout"
            assert len(router.requests) <= bound
        await sim.drain()
        sim.check_clean()

    run(main())


# --- scaling -------------------------------------------------------------------------------------


class FakeScaler:
    """Stands in for the launcher: new workers join the Sim at once; removed ones are recorded."""

    def __init__(self, sim: Sim):
        self.sim, self.removed = sim, []

    async def add(self, role: str, count: int) -> list[str]:
        ids = []
        for _ in range(count):
            w = FakeWorker(f"{role[0]}{len(self.sim.workers) + len(self.removed)}", role)
            self.sim.workers[w.worker_id] = w
            await self.sim.send(w, hello(w))
            await self.sim.heartbeat(w)
            ids.append(w.worker_id)
        return ids

    async def remove(self, worker_id: str) -> None:
        self.removed.append(worker_id)
        self.sim.workers.pop(worker_id)  # gone for good: the Sim must not revive it


def test_removal_drains_the_worker_before_stopping_it_and_loses_nothing(make_router):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=2, drain_timeout=10.0).start()
        scaler = sim.router.scaling.scaler = FakeScaler(sim)
        for i in range(6):
            await sim.submit(f"r{i}", max_tokens=12, stream=True)
        for w in list(sim.workers.values()):
            await sim.step(w)
        busy = {rid for w in ("d0", "d1") for rid in sim.workers[w].blocks}
        assert len(busy) == 6
        removal = asyncio.create_task(sim.router.scaling.scale("decode", -1))
        await asyncio.sleep(0.15)
        victim = next(w for w in sim.router.stats().workers if w.draining)
        assert not removal.done() and scaler.removed == []  # still finishing its requests
        for i in range(6, 10):  # new work goes to the other decode worker only
            await sim.submit(f"r{i}", max_tokens=4)
        while not removal.done():
            for w in list(sim.workers.values()):
                await sim.step(w)
            await asyncio.sleep(0.05)
        ok, message, ids = removal.result()
        assert ok and ids == [victim.worker_id] == scaler.removed, message
        assert victim.worker_id not in sim.router.registry.workers
        await sim.drain()
        sim.check_clean()
        assert all(isinstance(sim.terminal(f"r{i}"), P.Result) for i in range(10))
        ok, message, _ = await sim.router.scaling.scale("decode", -1)
        assert not ok and "at least one must stay" in message

    run(main())


def test_a_drain_past_its_timeout_moves_the_streams_it_still_holds(make_router):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=2, drain_timeout=0.3).start()
        sim.router.scaling.scaler = FakeScaler(sim)
        for i in range(4):
            await sim.submit(f"s{i}", max_tokens=30, stream=True)
        while not all(sim.replies[f"s{i}"] for i in range(4)):  # every client has seen tokens
            for w in list(sim.workers.values()):
                await sim.step(w)
        ok, message, (victim,) = await sim.router.scaling.scale("decode", -1)  # nothing steps: it times out
        assert ok and "timed out" in message
        await sim.drain()
        sim.check_clean()  # every stream whole: no gap, no duplicate, 30 tokens
        assert all(isinstance(sim.terminal(f"s{i}"), P.Result) for i in range(4))
        assert sim.router.stats().totals.migrations == 2  # the victim's half

    run(main())


def test_added_workers_join_and_get_requests(make_router):
    async def main():
        sim = await disagg(make_router, prefill=1, decode=1).start()
        sim.router.scaling.scaler = FakeScaler(sim)
        ok, _, ids = await sim.router.scaling.scale("decode", 2)
        assert ok and ids == ["d2", "d3"]
        assert {w.worker_id for w in sim.router.stats().workers} == {"p0", "d0", "d2", "d3"}
        for i in range(6):
            await sim.submit(f"r{i}", max_tokens=4)
        assert all(sim.router.registry.workers[w].assigned for w in ids)
        await sim.drain()
        sim.check_clean()
        ok, message, _ = await sim.router.scaling.scale("colocated", 1)
        assert not ok and "no colocated workers" in message

    run(main())


def test_request_table_follows_a_request_through_its_attempts():
    table = RequestTable()
    req = Request(table.new_rid(), b"c", "r1", [1, 2, 3], SamplingParams(max_tokens=4), True, None)
    table.add(req)
    first = req.rid
    with pytest.raises(AssertionError):  # one client id is one request
        table.add(Request(table.new_rid(), b"c", "r1", [1], SamplingParams(), True, None))
    table.next_attempt(req, lambda rid: setattr(req, "rid", rid))
    assert req.rid != first and table.get(first) is None and table.get(req.rid) is req
    assert table.of_client(b"c", "r1") is req and len(table) == 1 and list(table) == [req]
    table.remove(req)
    assert not table and table.get(req.rid) is None and table.of_client(b"c", "r1") is None


def test_the_routers_startup_collection_is_no_stall_while_serving(make_router, caplog):
    """`serve` freezes the startup heap with a full collection (long, with a big heap) before it starts watching its
    loop: that pause is the start's, not a stall in serving."""
    router = make_router(log_stall_stacks=True)
    router._client_loop = router._worker_loop = router._housekeeping = lambda: asyncio.sleep(0)
    router._broadcast = lambda msg: asyncio.sleep(0)
    heap = [(i, str(i)) for i in range(2_000_000)]  # a full collection of this takes well over 50 ms

    async def main():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        await router.serve(stop)

    with caplog.at_level("WARNING", logger="common.stalls"):
        run(main())
    del heap
    assert not [r for r in caplog.records if "event loop stalled" in r.getMessage()]
