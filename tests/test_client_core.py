"""The client core without sockets (router/client/core.py, its flows' parts router/client/flow.py): frames in, what
each call sees, the frames it sends, and the flows' waits, answered by hand."""
from __future__ import annotations

import pytest

from common import protocol as P
from router.client.core import ClientCore, StreamState
from router.client.flow import Run, Sleep, Wait
from router.client.results import ClientError, ClientTimeout, Completion, ServerError

USAGE = P.Usage(prompt_tokens=1, completion_tokens=1, cached_tokens=0)
TIMINGS = P.Timings(queued=0.0, ttft=0.1, e2e=0.2, itl=[])


def core(**kw) -> tuple[ClientCore, list[P.Message]]:
    sent: list[P.Message] = []
    return ClientCore("tcp://test", lambda frame: sent.append(P.decode(frame)), kw.get("timeout"),
                      kw.get("retries", 0), kw.get("connect_timeout")), sent


def result(request_id: str, tokens: list[int]) -> P.Result:
    return P.Result(request_id=request_id, token_ids=tokens, text="x", finish_reason="stop", usage=USAGE,
                    timings=TIMINGS)


def test_replies_go_to_their_call_and_stale_ones_are_dropped():
    c, sent = core()
    a = c.submit("hi", False, True, "a", None, {})
    b = c.submit([1, 2], False, False, "b", None, {})
    assert [m.request_id for m in sent] == ["a", "b"] and isinstance(sent[0], P.Submit)
    c.receive(P.encode(P.Delta(request_id="b", token_ids=[1], text="x", index=0)))
    c.receive(P.encode(P.Delta(request_id="gone", token_ids=[1], text="x", index=0)))  # an aborted request's
    assert not a.box.items and [m.request_id for m in b.box.items] == ["b"]


def test_control_replies_match_by_nonce_or_come_oldest_first():
    c, sent = core()
    ping, stats = c.ping(1.0), c.stats(1.0)
    ping_wait, stats_wait = next(ping), next(stats)
    nonce = sent[0].nonce
    c.receive(P.encode(P.Pong(nonce=nonce + 1)))  # someone else's
    assert not ping_wait.box.items
    c.receive(P.encode(P.Stats(uptime=1.0, requests_in_flight=0, queued_requests=0, workers=[])))
    c.receive(P.encode(P.Pong(nonce=nonce)))
    assert isinstance(stats_wait.box.items[0], P.Stats) and isinstance(ping_wait.box.items[0], P.Pong)
    with pytest.raises(StopIteration) as done:
        ping.send(ping_wait.box.items.popleft())
    assert done.value.value >= 0
    assert not c.waiters  # both answered and forgotten


def test_an_undecodable_frame_fails_its_call_or_else_everyone():
    c, _ = core()
    a, b = c.submit("x", False, False, "a", None, {}), c.submit("y", False, False, "b", None, {})
    c.receive(b'\x83\xa1v\x01\xa4type\xa5delta\xaarequest_id\xa1a')  # a delta for `a`, missing its fields
    assert isinstance(a.box.items[0], ClientError) and not b.box.items
    c.receive(b"\xc1")  # nobody's: whoever it was for would wait forever
    assert isinstance(b.box.items[0], ClientError) and len(a.box.items) == 2


def test_generate_resubmits_what_a_retry_may_cure_then_returns_the_completion():
    c, sent = core(retries=2)
    flow = c.generate("hi", False, 10.0, "r1", None, {})
    wait = next(flow)
    assert isinstance(wait, Wait) and [m.TYPE for m in sent] == ["submit"]
    sleep = flow.send(P.Error(request_id="r1", code=P.OVERLOADED, message="busy", retry_after=0.05))
    assert sleep == Sleep(0.05)
    wait = flow.send(None)
    assert [m.TYPE for m in sent] == ["submit", "submit"] and sent[1].request_id == "r1"
    with pytest.raises(StopIteration) as done:
        flow.send(result("r1", [7]))
    assert isinstance(done.value.value, Completion) and done.value.value.token_ids == [7]
    assert [m.TYPE for m in sent] == ["submit", "submit"]  # a finished request is not aborted
    assert not c.calls


def test_generate_gives_up_on_errors_a_retry_cannot_cure():
    c, sent = core(retries=5)
    flow = c.generate("hi", False, None, "r1", None, {})
    next(flow)
    with pytest.raises(ServerError) as info:
        flow.send(P.Error(request_id="r1", code=P.BAD_REQUEST, message="no"))
    assert info.value.code == P.BAD_REQUEST and [m.TYPE for m in sent] == ["submit"] and not c.calls


def test_a_timeout_aborts_the_request(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("router.client.core.time.monotonic", lambda: clock[0])
    c, sent = core(timeout=0.5)
    flow = c.generate("hi", False, None, "r1", None, {})
    next(flow)
    clock[0] = 100.5
    with pytest.raises(ClientTimeout, match="r1 timed out after 0.5 s"):
        flow.send(None)  # the driver's answer when the deadline passed
    assert [m.TYPE for m in sent] == ["submit", "abort"] and not c.calls


def test_an_interrupt_while_waiting_aborts_through_the_flow():
    c, sent = core()
    run = Run(c.generate("hi", False, None, "r1", None, {}))
    with pytest.raises(KeyboardInterrupt), run.waiting():
        raise KeyboardInterrupt  # as a driver's wait would be interrupted
    assert [m.TYPE for m in sent] == ["submit", "abort"]


def test_a_stream_yields_deltas_then_keeps_its_result():
    c, sent = core()
    stream = StreamState(c.submit("hi", False, True, "s", None, {}))
    flow = c.next_delta(stream)
    assert isinstance(next(flow), Wait)
    with pytest.raises(StopIteration) as done:
        flow.send(P.Delta(request_id="s", token_ids=[1], text="a", index=0))
    assert done.value.value.token_ids == [1]
    flow = c.next_delta(stream)
    next(flow)
    with pytest.raises(StopIteration) as done:
        flow.send(result("s", [1]))
    assert done.value.value is None and stream.result.token_ids == [1]
    with pytest.raises(StopIteration):
        next(c.next_delta(stream))  # over: no more waits
    assert [m.TYPE for m in sent] == ["submit"]


def test_a_streams_routed_deltas_are_taken_without_a_flow_but_not_its_end():
    """`queued_delta` (the async stream's way past a flow for each token) takes only what the flow would return at
    once: a Delta already routed. The Result and errors are left to the flow, which ends the call."""
    c, _ = core()
    stream = StreamState(c.submit("hi", False, True, "s", None, {}))
    assert c.queued_delta(stream) is None
    c.receive(P.encode(P.Delta(request_id="s", token_ids=[1], text="a", index=0)))
    c.receive(P.encode(P.Delta(request_id="s", token_ids=[2], text="b", index=1)))
    c.receive(P.encode(result("s", [1, 2])))
    assert [c.queued_delta(stream).token_ids for _ in range(2)] == [[1], [2]]
    assert c.queued_delta(stream) is None and "s" in c.calls
    flow = c.next_delta(stream)
    wait = next(flow)
    with pytest.raises(StopIteration) as done:
        flow.send(wait.box.items.popleft())
    assert done.value.value is None and stream.result.token_ids == [1, 2] and "s" not in c.calls


def test_a_closed_core_refuses_to_send_and_fails_what_waits():
    c, _ = core()
    call = c.submit("hi", False, False, "r1", None, {})
    c.close_with(ClientError("the client is closed"))
    assert isinstance(call.box.items[0], ClientError)
    with pytest.raises(ClientError, match="closed"):
        c.submit("again", False, False, None, None, {})
    call.close()  # no abort is sent through a closed client


def test_until_a_router_answers_no_wait_outlasts_the_connect_timeout(monkeypatch):
    """ZMQ connects to nothing without a word: the first frame out brings a ping, and until any answer comes every
    wait ends at the connect deadline with an error that says no router answered there."""
    clock = [100.0]
    monkeypatch.setattr("router.client.core.time.monotonic", lambda: clock[0])
    c, sent = core(connect_timeout=10.0)
    flow = c.generate("hi", False, None, "a", 0, {})  # no timeout of its own: it would wait forever
    wait = next(flow)
    assert [type(m) for m in sent] == [P.Ping, P.Submit] and wait.deadline == 110.0
    clock[0] = 110.5
    with pytest.raises(ClientTimeout, match="no router answered at tcp://test within 10 s"):
        flow.send(None)
    assert isinstance(sent[-1], P.Abort)  # the request is given up where it may have arrived after all


def test_once_the_router_has_answered_only_the_calls_own_deadlines_count(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("router.client.core.time.monotonic", lambda: clock[0])
    c, sent = core(connect_timeout=10.0)
    flow = c.generate("hi", False, None, "a", 0, {})
    next(flow)
    c.receive(P.encode(P.Pong(nonce=sent[0].nonce)))  # the router is there
    clock[0] = 500.0
    again = c.generate("more", False, None, "b", 0, {})
    assert next(again).deadline is None and [type(m) for m in sent[2:]] == [P.Submit]  # one ping per client


def test_wait_ready_waits_its_own_timeout_for_a_router_still_starting(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("router.client.core.time.monotonic", lambda: clock[0])
    c, sent = core(connect_timeout=0.5)
    flow = c.wait_ready(60.0)
    wait = next(flow)
    assert wait.deadline == 101.0  # one stats request's own second, not the connect deadline's end
    clock[0] = 101.5
    assert isinstance(flow.send(None), (Wait, Sleep))  # no answer yet: it asks again


def test_a_router_that_answers_while_a_call_waits_leaves_the_call_its_own_deadline(monkeypatch):
    """The first wait of a call is cut at the connect deadline; if the router answered meanwhile (the ping came back
    while a long `scale` runs), the call waits on for its own deadline instead of timing out."""
    clock = [100.0]
    monkeypatch.setattr("router.client.core.time.monotonic", lambda: clock[0])
    c, sent = core(connect_timeout=10.0)
    flow = c.scale("decode", 1, 600.0)
    first = next(flow)
    assert first.deadline == 110.0
    c.receive(P.encode(P.Pong(nonce=sent[0].nonce)))  # the router is there, the scale goes on
    clock[0] = 110.5
    again = flow.send(None)
    assert isinstance(again, Wait) and again.deadline == 700.0
