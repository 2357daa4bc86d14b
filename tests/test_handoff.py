"""One KV handoff per request, on each side: its states, and the workers' rule that a request's blocks are never freed
while a streaming transport still reads or writes them (kvtransfer/handoff.py)."""
from __future__ import annotations

import select
import threading
import time
from concurrent.futures import Future

import msgspec

from common import protocol as P
from common.engine.sequence import Sequence
from common.sampling_params import SamplingParams
from common.worker.config import WorkerConfig
from common.worker.timeline import Timeline
from common.worker.wakeup import Wakeup
from decode_worker.worker import DecodeWorker
from kvtransfer.errors import TransferError
from kvtransfer.handoff import Handoff, HandoffState, HandoffTable
from prefill_worker.worker import PrefillWorker

BLOCK_SIZE = 4


# ---- the table ------------------------------------------------------------------------------------------

def test_a_transfer_ending_moves_the_handoff_on_once():
    table = HandoffTable()
    ok, broken = Future(), Future()
    for rid, pending in (("ok", ok), ("broken", broken)):
        h = table.open(Handoff(rid, "p0", deadline=time.monotonic() + 60))
        h.moving(pending, HandoffState.LANDING, h.deadline)
        table.watch(h)
    assert table.transferring and table.transfers_ended() == []
    ok.set_result(None)
    broken.set_exception(TransferError("link broke"))
    ended = {h.request_id: h for h in table.transfers_ended()}
    assert ended["ok"].state is HandoffState.LANDED and not ended["ok"].busy
    assert ended["broken"].state is HandoffState.FAILED and ended["broken"].code == P.ABORTED
    assert "link broke" in ended["broken"].reason
    assert table.transfers_ended() == [] and not table.transferring and len(table) == 2


def test_a_copy_that_finished_at_once_lands_without_a_transfer_to_poll():
    h = Handoff("r1", "p0", deadline=None)
    h.moving(None, HandoffState.SENDING, time.monotonic() + 60)
    assert h.state is HandoffState.LANDED and not h.busy and h.deadline is not None


def test_deadlines_fail_what_is_still_waiting_and_nothing_else():
    table = HandoffTable()
    now = time.monotonic()
    late = table.open(Handoff("late", "p0", deadline=now - 1))
    table.open(Handoff("prefilling", "d0", deadline=None))  # no deadline before the send
    table.open(Handoff("on_time", "p0", deadline=now + 60))
    done = table.open(Handoff("acked", "p0", deadline=now - 1, state=HandoffState.ACKED))
    assert table.expired(now) == [late]
    assert late.state is HandoffState.FAILED and late.code == P.TIMEOUT and done.state is HandoffState.ACKED
    assert table.expired(now) == []  # failed once


def test_the_first_failure_is_the_one_reported():
    h = Handoff("r1", "p0", deadline=None)
    h.fail(P.ABORTED, "aborted", report=False)
    h.fail(P.TIMEOUT, "KV handoff timed out")
    assert (h.code, h.reason, h.report) == (P.ABORTED, "aborted", False)


# ---- the workers ----------------------------------------------------------------------------------------

class StubEngine:
    """The parts of LLMEngine the handoff code touches; records what it was asked to do."""

    def __init__(self):
        self.requests: dict[str, Sequence] = {}
        self.aborted: list[str] = []
        self.admitted: list[str] = []

    def reserve(self, request_id: str, block_ids: list[int]) -> None:
        seq = Sequence(request_id, [1] * (len(block_ids) * BLOCK_SIZE - 1), SamplingParams())
        seq.block_table = block_ids
        self.requests[request_id] = seq

    def get(self, request_id: str) -> Sequence | None:
        return self.requests.get(request_id)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.requests.pop(request_id, None)

    def admit_prefilled(self, request_id: str, first_token: int, cached_tokens: int = 0) -> Sequence:
        self.admitted.append(request_id)
        seq = self.requests.pop(request_id)
        seq.token_ids.append(first_token)
        return seq


class StubTransport:
    """A streaming transport: receive and send return futures the test resolves."""

    name = "nccl"

    def __init__(self):
        self.pending: Future = Future()
        self.discarded: list[str] = []

    def receive(self, record, dst_block_ids, frames):
        return self.pending

    def discard(self, record, frames):
        self.discarded.append(record.request_id)

    def open(self, peer_id, peer):
        self.opened = Future()
        return f"link-to-{peer_id}", self.opened

    def join(self, peer_id, link):
        self.joined = (peer_id, link)
        return Future()


class StubEndpoint:
    def __init__(self, sent: list):
        self.transports = {"nccl": StubTransport()}
        self.address = "tcp://127.0.0.1:2"
        self.connected: list[str] = []
        self.channel = type("Channel", (), {"send": lambda _, address, msg, payload=None: sent.append(msg),
                                            "connect": lambda _, address: self.connected.append(address)})()


def stub_worker(cls):
    """A worker of role `cls` without an engine, sockets or thread: its handlers, and what they send."""
    w = object.__new__(cls)
    w.config = WorkerConfig(worker_id="w0", router_address="")
    w.engine = StubEngine()
    w.wakeup = Wakeup()
    w.handoffs = HandoffTable(on_transfer_end=w.wakeup.wake)
    w.to_router, w.to_peers = [], []
    w.kv = StubEndpoint(w.to_peers)
    w.send = w.to_router.append
    w.timeline = Timeline(None, "w0", cls.role)
    w.opening = {}
    return w


def reserved(w: DecodeWorker, request_id: str, block_ids: list[int]) -> None:
    w.engine.reserve(request_id, block_ids)
    w.handoffs.open(Handoff(request_id, "p0", deadline=time.monotonic() + 60))


def handoff(request_id: str, block_ids: list[int]) -> P.KVHandoff:
    return P.KVHandoff(request_id=request_id, src_worker_id="p0", first_token=42,
                       num_tokens=len(block_ids) * BLOCK_SIZE - 1, transport="nccl", dst_block_ids=block_ids,
                       reply_to="tcp://127.0.0.1:1",
                       nccl=P.NcclStream(link="x", seq=0, block_bytes=64, segments=[len(block_ids)]))


def tick(w) -> None:
    w.tick(time.monotonic(), expire=True)


def test_decode_admits_only_after_the_kv_has_landed():
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    assert w.handoffs.get("r1").transport == ""  # not known before the record comes
    w.receive(handoff("r1", [4, 5]), [])
    assert w.handoffs.get("r1").state is HandoffState.LANDING and w.busy()
    assert w.handoffs.get("r1").transport == "nccl"  # the record's
    assert w.engine.admitted == [] and w.to_peers == []
    tick(w)
    assert w.engine.admitted == []  # not yet
    w.kv.transports["nccl"].pending.set_result(None)
    tick(w)
    assert w.engine.admitted == ["r1"] and "r1" not in w.handoffs and not w.busy()
    assert [(m.request_id, m.ok) for m in w.to_peers] == [("r1", True)]
    assert isinstance(w.to_router[-1], P.TokenBatch) and w.to_router[-1].updates[0].token_ids == [42]


def test_decode_keeps_blocks_of_an_aborted_request_until_its_transfer_ends():
    """Freed blocks could be reserved by the next request while bytes still land in them."""
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    w.abort("r1")  # the client gave up
    assert w.engine.aborted == [] and "r1" in w.engine.requests
    assert [(m.request_id, m.ok, m.message) for m in w.to_peers] == [("r1", False, "aborted")]
    w.kv.transports["nccl"].pending.set_result(None)
    tick(w)
    assert w.engine.aborted == ["r1"] and w.engine.admitted == [] and "r1" not in w.handoffs
    assert len(w.to_peers) == 1  # acknowledged once
    assert not any(isinstance(m, P.Error) for m in w.to_router)  # the router aborted it: nothing to report


def test_decode_times_out_a_handoff_whose_kv_lands_too_late_and_frees_after_the_transfer():
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    w.handoffs.get("r1").deadline = time.monotonic() - 1
    tick(w)
    assert [(m.code, m.request_id) for m in w.to_router] == [(P.TIMEOUT, "r1")] and w.engine.aborted == []
    w.kv.transports["nccl"].pending.set_result(None)
    tick(w)
    assert w.engine.aborted == ["r1"] and w.engine.admitted == [] and len(w.to_router) == 1


def test_decode_fails_the_request_when_its_transfer_fails():
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    w.kv.transports["nccl"].pending.set_exception(TransferError("link broke"))
    tick(w)
    assert w.engine.aborted == ["r1"] and w.engine.admitted == []
    assert w.to_peers[0].ok is False and "link broke" in w.to_peers[0].message
    assert isinstance(w.to_router[-1], P.Error) and w.to_router[-1].code == P.ABORTED


def test_decode_drains_a_refused_handoff():
    w = stub_worker(DecodeWorker)
    w.receive(handoff("gone", [4, 5]), [])  # no reservation: aborted before its KV came
    assert w.kv.transports["nccl"].discarded == ["gone"] and not w.busy()
    assert w.to_peers[0].ok is False and "no reservation" in w.to_peers[0].message


def test_decode_refuses_a_handoff_that_does_not_match_its_reservation():
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    w.receive(handoff("r1", [4, 6]), [])
    assert w.kv.transports["nccl"].discarded == ["r1"] and w.engine.aborted == ["r1"]
    assert w.to_peers[0].ok is False and "does not match the reservation" in w.to_peers[0].message
    assert w.to_router[-1].code == P.INTERNAL and "r1" not in w.handoffs


def prefill_sending(w: PrefillWorker, request_id: str, pending: Future) -> Handoff:
    h = w.handoffs.open(Handoff(request_id, "d0", deadline=None))
    h.moving(pending, HandoffState.SENDING, time.monotonic() + 60)
    w.handoffs.watch(h)
    return h


def test_prefill_keeps_blocks_until_its_send_ends():
    w = stub_worker(PrefillWorker)
    sending: Future = Future()
    prefill_sending(w, "r1", sending)
    w.on_record(P.HandoffAck(request_id="r1", ok=True), [])
    assert w.engine.aborted == []  # acknowledged before the send future resolved
    sending.set_result(None)
    tick(w)
    assert w.engine.aborted == ["r1"] and "r1" not in w.handoffs
    failing: Future = Future()
    prefill_sending(w, "r2", failing)
    failing.set_exception(TransferError("peer gone"))
    tick(w)
    assert w.engine.aborted == ["r1", "r2"]
    assert isinstance(w.to_router[-1], P.Error) and "peer gone" in w.to_router[-1].message


def test_prefill_frees_the_blocks_of_a_refused_handoff_without_a_second_error():
    w = stub_worker(PrefillWorker)
    prefill_sending(w, "r1", Future()).pending.set_result(None)
    tick(w)
    assert w.handoffs.get("r1").state is HandoffState.LANDED  # sent: waiting for the ack
    w.on_record(P.HandoffAck(request_id="r1", ok=False, message="layout"), [])
    assert w.engine.aborted == ["r1"] and w.to_router == []  # the decode worker reported it


def test_prefill_times_out_without_an_ack():
    w = stub_worker(PrefillWorker)
    prefill_sending(w, "r1", Future()).pending.set_result(None)
    tick(w)
    w.handoffs.get("r1").deadline = time.monotonic() - 1
    tick(w)
    assert w.engine.aborted == ["r1"] and [(m.code, m.request_id) for m in w.to_router] == [(P.TIMEOUT, "r1")]


def test_a_prefill_worker_opens_a_link_when_asked_and_answers_once_it_works():
    """open_link: the decode worker is told to join (kv_link_open on the data channel), and the router hears back
    only once the link's first word has gone, or why it did not; a transport it lacks is an answer at once."""
    w = stub_worker(PrefillWorker)
    ask = P.OpenLink(decode_worker_id="d0", decode_kv_address="tcp://127.0.0.1:9", transport="nccl")
    w.on_open_link(ask)
    assert w.kv.connected == ["tcp://127.0.0.1:9"]  # the data channel to it, ahead of the first handoff's record
    assert w.to_peers == [P.KVLinkOpen(src_worker_id="w0", transport="nccl", link="link-to-d0")]
    tick(w)
    assert w.to_router == [] and w.busy() and not woken(w)  # busy while the link opens
    w.kv.transports["nccl"].opened.set_result(None)
    assert woken(w)  # its end wakes the loop
    tick(w)
    assert w.to_router == [P.LinkOpened(decode_worker_id="d0")] and not w.busy()
    w.on_open_link(ask)
    w.kv.transports["nccl"].opened.set_exception(TransferError("no peer"))
    tick(w)
    assert w.to_router[-1] == P.LinkOpened(decode_worker_id="d0", error="no peer")
    w.on_open_link(msgspec.structs.replace(ask, transport="host"))
    assert w.to_router[-1] == P.LinkOpened(decode_worker_id="d0", error="this prefill worker has no 'host' transport")


def test_a_decode_worker_joins_the_link_a_prefill_worker_opened():
    w = stub_worker(DecodeWorker)
    w.on_record(P.KVLinkOpen(src_worker_id="p0", transport="nccl", link="abc"), [])
    assert w.kv.transports["nccl"].joined == ("p0", "abc") and w.to_router == []


def test_a_prefill_handoff_names_the_transport_its_task_asked_for():
    task = P.PrefillTask(request_id="r1", token_ids=[1, 2], sampling=P.Sampling(), decode_worker_id="d0",
                         decode_kv_address="tcp://127.0.0.1:3", dst_block_ids=[0], transport="cuda_ipc")
    assert Handoff("r1", "d0", deadline=None, task=task).transport == "cuda_ipc"


def test_a_decode_reservation_waits_out_a_long_prefill_and_times_only_the_landing():
    """Until the KV is sent the wait is the router's (it frees the reservation if the prefill worker dies or
    fails): an hour of prefill is no timeout. Once the KV starts to land, --handoff-timeout runs."""
    w = stub_worker(DecodeWorker)
    w.engine.reserve = lambda rid, ids, sampling: StubEngine.reserve(w.engine, rid, [4, 5]) or [4, 5]
    w.on_reserve(P.Reserve(request_id="r1", token_ids=[1] * (2 * BLOCK_SIZE - 1), sampling=SamplingParams(),
                           prefill_worker_id="p0"))
    assert isinstance(w.to_router[-1], P.Reserved) and w.handoffs.get("r1").deadline is None
    w.tick(time.monotonic() + 3600, expire=True)
    assert "r1" in w.handoffs and w.engine.aborted == [] and len(w.to_router) == 1
    before = time.monotonic()
    w.receive(handoff("r1", [4, 5]), [])
    h = w.handoffs.get("r1")
    assert h.state is HandoffState.LANDING
    assert before + w.config.handoff_timeout <= h.deadline <= time.monotonic() + w.config.handoff_timeout


def test_a_decode_worker_without_free_blocks_refuses_a_reservation_at_once() -> None:
    """No wait between three parties: a decode worker never waits for blocks to free (the router, waiting on it,
    may have promised them elsewhere). It answers overloaded with a retry hint, the router's to act on, and
    holds nothing for the request."""
    w = stub_worker(DecodeWorker)
    w.engine.reserve = lambda rid, ids, sampling: None  # every block taken
    w.on_reserve(P.Reserve(request_id="r1", token_ids=[1] * (2 * BLOCK_SIZE - 1), sampling=SamplingParams(),
                           prefill_worker_id="p0"))
    (reply,) = w.to_router
    assert isinstance(reply, P.Error) and reply.request_id == "r1" and reply.code == P.OVERLOADED
    assert reply.retry_after is not None and reply.retry_after > 0
    assert "r1" not in w.handoffs and not w.busy() and w.to_peers == []


def woken(w) -> bool:
    """Whether the worker's loop has a wake-up pending (taking it)."""
    ready = bool(select.select([w.wakeup], [], [], 0)[0])
    w.wakeup.clear()
    return ready


def test_a_transfer_ending_wakes_the_worker_loop():
    w = stub_worker(DecodeWorker)
    reserved(w, "r1", [4, 5])
    w.receive(handoff("r1", [4, 5]), [])
    assert not woken(w)
    w.kv.transports["nccl"].pending.set_result(None)  # on the transport's thread, in a worker
    assert woken(w)


class StepEvent:
    """A running step's CUDA event, stood in for: done when the test says."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.done.wait()


def waiting_worker(monkeypatch) -> tuple[PrefillWorker, list[int]]:
    """A prefill worker whose loop polls only its wake-ups; the poll timeouts it asked for. The loop's own timeout is
    made an hour: a wait below that returns only when something wakes it."""
    import zmq

    from common.worker import runtime

    monkeypatch.setattr(runtime, "IDLE_POLL_MS", 3_600_000)
    w = stub_worker(PrefillWorker)
    w.inputs = {}
    poller, timeouts = zmq.Poller(), []
    poller.register(w.wakeup.fileno(), zmq.POLLIN)
    w._poller = type("Poller", (), {"poll": lambda self, t: timeouts.append(t) or poller.poll(t)})()
    return w, timeouts


def test_a_worker_waits_for_its_step_blocked_while_a_transfer_is_in_flight(monkeypatch):
    """While a step runs, the loop polls its messages without waiting, but with a KV transfer in flight it waits in
    its poll (holding no GIL: the transfer's thread needs it between its operations) until the transfer ends."""
    w, timeouts = waiting_worker(monkeypatch)
    step = StepEvent()
    w._meanwhile(step)
    assert timeouts == [0]
    sending: Future = Future()
    prefill_sending(w, "r1", sending)
    threading.Timer(0.2, sending.set_result, (None,)).start()
    start = time.monotonic()
    w._meanwhile(step)
    assert timeouts[1] > 0 and 0.15 < time.monotonic() - start < 60
    assert w.handoffs.get("r1").state is HandoffState.LANDED and not w.busy()  # settled when it woke
    w._meanwhile(step)
    assert timeouts[2] == 0


def test_a_worker_waiting_blocked_wakes_when_its_step_ends(monkeypatch):
    w, timeouts = waiting_worker(monkeypatch)
    prefill_sending(w, "r1", Future())
    step = StepEvent()
    threading.Timer(0.2, step.done.set).start()
    start = time.monotonic()
    while not step.query():  # as InFlight.tokens calls it
        w._meanwhile(step)
    assert 0.15 < time.monotonic() - start < 60 and len(timeouts) <= 3 and all(t > 0 for t in timeouts)
    w.wakeup.close()
