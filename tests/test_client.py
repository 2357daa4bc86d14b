"""router/client.py against a fake router: a thread with a ROUTER socket that speaks the protocol."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack
import pytest
import zmq

from common.protocol import (
    CLIENT_TO_ROUTER,
    Abort,
    Delta,
    Error,
    Message,
    Ping,
    Pong,
    Result,
    Stats,
    StatsRequest,
    Submit,
    Timings,
    Usage,
    WorkerStats,
    decode,
    encode,
)
from common.sampling_params import InvalidRequest
from router.client import (
    AsyncClient,
    Client,
    ClientError,
    Completion,
    ServerError,
    readiness_problem,
)
from scripts.cli import main

# --- the fake router -----------------------------------------------------------------------------

Script = Callable[[Submit], list]


def worker(worker_id: str, role: str, alive: bool = True) -> WorkerStats:
    return WorkerStats(worker_id=worker_id, role=role, alive=alive, queued_requests=0, queued_tokens=0,
                       running_requests=0, kv_blocks_total=100, kv_blocks_free=100)


def stats_of(*workers: WorkerStats) -> Stats:
    return Stats(uptime=1.0, requests_in_flight=0, queued_requests=0, workers=list(workers))


READY = stats_of(worker("p0", "prefill"), worker("d0", "decode"))


def completion_text(submit: Submit) -> str:
    """The fake model: the prompt upper-cased, or the token ids as letters."""
    if submit.prompt is not None:
        return submit.prompt.upper()
    return "".join(chr(ord("a") + t % 26) for t in submit.token_ids or [])


def result_for(request_id: str, text: str, finish_reason: str = "stop") -> Result:
    return Result(
        request_id=request_id, token_ids=[ord(c) for c in text], text=text, finish_reason=finish_reason,
        usage=Usage(prompt_tokens=7, completion_tokens=len(text), cached_tokens=3),
        timings=Timings(queued=0.001, ttft=0.01 if text else None, e2e=0.02, itl=[0.001] * max(len(text) - 1, 0)),
    )


def reply(submit: Submit, text: str | None = None, piece: int = 3, gap: float = 0.0) -> list:
    """Deltas of `piece` characters (one token per character) if streaming, then the Result."""
    text = completion_text(submit) if text is None else text
    items: list = []
    if submit.stream:
        for i in range(0, len(text), piece):
            chunk = text[i:i + piece]
            items += [gap, Delta(request_id=submit.request_id, token_ids=[ord(c) for c in chunk], text=chunk, index=i)]
    return items + [gap, result_for(submit.request_id, text)]


def special_prompts(submit: Submit) -> list:
    """The default script: a few prompts trigger errors or silence, every other one is echoed."""
    rid = submit.request_id
    if submit.prompt == "overloaded":
        return [Error(request_id=rid, code="overloaded", message="queue is full", retry_after=1.5)]
    if submit.prompt == "hang":
        return []
    if submit.prompt == "slow":
        return reply(submit, "x" * 40, piece=1, gap=0.02)
    if submit.prompt == "stale":  # replies of requests this client never made or gave up
        return [result_for("someone-else", "NOPE"), Delta(request_id="old", token_ids=[1], text="?", index=0),
                Error(request_id="old", code="internal", message="x")] + reply(submit)
    if submit.prompt == "garbled":  # a frame that names the request but is not valid
        return [msgpack.packb({"v": 2, "type": "result", "request_id": rid})]
    if submit.prompt == "garbage":
        return [b"\xc1\xc1"]
    if (submit.prompt or "").startswith("wait "):
        return [float(submit.prompt.split()[1])] + reply(submit)
    return reply(submit)


@dataclass
class FakeRouter:
    script: Script = special_prompts
    stats: Stats | None = READY  # None: never answer stats_request
    submits: list[Submit] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = zmq.Context.instance().socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self.address = f"tcp://127.0.0.1:{self._sock.bind_to_random_port('tcp://127.0.0.1')}"
        self._outbox: list[tuple[float, int, bytes, str, bytes]] = []  # (due, seq, peer, request_id, frame)
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            wait = min([due for due, *_ in self._outbox], default=time.monotonic() + 0.05) - time.monotonic()
            if self._sock.poll(max(1, min(50, int(wait * 1000)))):
                peer, frame = self._sock.recv_multipart()
                self._handle(peer, decode(frame, expect=CLIENT_TO_ROUTER))
            now = time.monotonic()
            for item in sorted(i for i in self._outbox if i[0] <= now):
                self._outbox.remove(item)
                self._sock.send_multipart([item[2], item[4]])

    def _handle(self, peer: bytes, msg: Message) -> None:
        if isinstance(msg, Submit):
            self.submits.append(msg)
            due = time.monotonic()
            for item in self.script(msg):
                if isinstance(item, float):
                    due += item
                else:
                    frame = item if isinstance(item, bytes) else encode(item)
                    self._outbox.append((due, next(self._seq), peer, msg.request_id, frame))
        elif isinstance(msg, Abort):
            self.aborts.append(msg.request_id)
            running = [i for i in self._outbox if i[3] == msg.request_id]
            for item in running:
                self._outbox.remove(item)
            if running:  # a running request ends with an "abort" result, which the client must ignore
                self._send(peer, result_for(msg.request_id, "", "abort"))
        elif isinstance(msg, Ping):
            self._send(peer, Pong(nonce=msg.nonce))
        elif isinstance(msg, StatsRequest) and self.stats is not None:
            self._send(peer, self.stats)

    def _send(self, peer: bytes, msg: Message) -> None:
        self._sock.send_multipart([peer, encode(msg)])


@pytest.fixture
def router():
    r = FakeRouter()
    yield r
    r.close()


@pytest.fixture
def client(router):
    with Client(router.address, timeout=5) as c:
        yield c


def eventually(check: Callable[[], bool], timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def free_address() -> str:
    """An address nothing listens on."""
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    sock.close()
    return f"tcp://127.0.0.1:{port}"


# --- Client --------------------------------------------------------------------------------------


def test_generate(client, router):
    out = client.generate("hello", max_tokens=5, temperature=0.5, seed=3)
    assert isinstance(out, Completion)
    assert (out.text, out.token_ids, out.finish_reason) == ("HELLO", [ord(c) for c in "HELLO"], "stop")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.cached_tokens) == (7, 5, 3)
    assert out.timings.ttft == 0.01 and len(out.timings.itl) == 4
    sent = router.submits[0]
    assert sent.request_id == out.request_id and len(out.request_id) == 32  # uuid4 hex
    assert not sent.stream and not sent.chat
    assert (sent.sampling.max_tokens, sent.sampling.temperature, sent.sampling.seed) == (5, 0.5, 3)
    assert sent.stop == []


def test_stop_strings_travel_in_the_submit(client, router):
    client.generate("hello", stop="\n")
    client.generate("hello", stop=["END", "###"])
    assert [s.stop for s in router.submits] == [["\n"], ["END", "###"]]
    with pytest.raises(InvalidRequest, match="stop"):
        client.generate("hello", stop=["x"] * 17)  # more than MAX_STOP_STRINGS


def test_generate_token_ids_chat_and_request_id(client, router):
    assert client.generate([0, 1, 2], request_id="mine").text == "abc"
    assert router.submits[0].token_ids == [0, 1, 2] and router.submits[0].request_id == "mine"
    client.generate("hi", chat=True)
    assert router.submits[1].chat and router.submits[1].prompt == "hi"


def test_stream_order_and_join_equals_result(client, router):
    text = "the quick brown fox"
    stream = client.stream(text, max_tokens=64)
    chunks = list(stream)
    assert len(chunks) > 3 and router.submits[0].stream
    assert [c.index for c in chunks] == list(range(0, len(text), 3))
    assert "".join(c.text for c in chunks) == stream.result.text == text.upper()
    assert [t for c in chunks for t in c.token_ids] == stream.result.token_ids
    assert stream.result.request_id == stream.request_id
    assert router.aborts == []


def test_stream_early_break_sends_abort(client, router):
    stream = client.stream("slow")
    for chunk in stream:
        break
    assert chunk.text == "x"
    assert eventually(lambda: router.aborts == [stream.request_id])
    assert stream.result is None
    # the router's "abort" result for it is now a stale reply: the next request must not see it
    assert client.generate("after").text == "AFTER"


def test_stream_close_sends_abort(client, router):
    with client.stream("slow") as stream:
        next(stream)
    assert eventually(lambda: router.aborts == [stream.request_id])


def test_timeout_raises_and_aborts(client, router):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out after 0.2 s"):
        client.generate("hang", timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 2
    assert eventually(lambda: router.aborts == [router.submits[0].request_id])
    stream = client.stream("slow", timeout=0.1)
    with pytest.raises(TimeoutError):
        list(stream)
    assert eventually(lambda: router.aborts[-1] == stream.request_id)
    assert client.generate("after").text == "AFTER"


def test_server_error(client, router):
    with pytest.raises(ServerError) as info:
        client.generate("overloaded", request_id="r-9")
    err = info.value
    assert isinstance(err, ClientError)
    assert (err.code, err.message, err.retry_after, err.request_id) == ("overloaded", "queue is full", 1.5, "r-9")
    assert "retry after 1.5 s" in str(err)
    assert router.aborts == []  # the request is over: nothing to abort


def test_stale_replies_ignored(client, router):
    assert client.generate("stale").text == "STALE"


def test_undecodable_frames_raise_client_error(client, router):
    with pytest.raises(ClientError, match="unsupported protocol version"):
        client.generate("garbled")
    assert eventually(lambda: router.aborts == [router.submits[0].request_id])
    with pytest.raises(ClientError, match="undecodable frame"):
        client.generate("garbage")
    assert client.generate("ok").text == "OK"


@pytest.mark.parametrize("bad, field_name", [
    ({"top_p": 2.0}, "top_p"), ({"max_tokens": 0}, "max_tokens"), ({"temperature": -1}, "temperature"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"), ({"seed": "x"}, "seed"),
])
def test_bad_sampling_rejected_client_side(client, router, bad, field_name):
    with pytest.raises(InvalidRequest, match=field_name) as info:
        client.generate("hi", **bad)
    assert info.value.field == field_name
    client.ping()  # the router has seen everything sent before the ping
    assert router.submits == []


def test_bad_arguments_rejected_client_side(client, router):
    with pytest.raises(TypeError, match="topp"):
        client.generate("hi", topp=0.5)
    with pytest.raises(InvalidRequest, match="token_ids"):
        client.generate([])
    with pytest.raises(InvalidRequest, match="chat"):
        client.generate([1, 2], chat=True)
    with pytest.raises(InvalidRequest, match="request_id"):
        client.generate("hi", request_id="x" * 200)
    client.ping()
    assert router.submits == []


def test_ping_stats_abort(client, router):
    assert 0 < client.ping() < 1
    assert client.stats() == READY
    stream = client.stream("slow")
    next(stream)
    client.abort(stream.request_id)
    list(stream)  # deltas already sent may come, then the "abort" result
    assert stream.result.finish_reason == "abort"
    assert router.aborts == [stream.request_id]


def test_control_timeouts():
    with Client(free_address()) as c:
        with pytest.raises(TimeoutError, match="no pong"):
            c.ping(timeout=0.1)
        with pytest.raises(TimeoutError, match="no stats"):
            c.stats(timeout=0.1)


def test_readiness_problem():
    assert readiness_problem(READY) is None
    assert readiness_problem(stats_of(worker("c0", "colocated"))) is None
    assert "no alive prefill and decode worker (0 of 0" in readiness_problem(stats_of())
    problem = readiness_problem(stats_of(worker("p0", "prefill"), worker("d0", "decode", alive=False)))
    assert problem == "no alive decode worker (1 of 2 known workers alive)"


def test_wait_ready(client, router):
    client.wait_ready(1)
    router.stats = stats_of(worker("p0", "prefill"), worker("d0", "decode", alive=False))
    with pytest.raises(TimeoutError, match=r"not ready after 0.3 s: no alive decode worker"):
        client.wait_ready(0.3)
    threading.Timer(0.2, lambda: setattr(router, "stats", stats_of(worker("c0", "colocated")))).start()
    client.wait_ready(2)
    router.stats = None
    with pytest.raises(TimeoutError, match="the router did not answer"):
        client.wait_ready(0.3)


def test_closed_client(router):
    c = Client(router.address)
    stream = c.stream("slow")
    c.close()
    with pytest.raises(ClientError, match="closed"):
        next(stream)
    with pytest.raises(ClientError, match="closed"):
        c.generate("hi")


# --- AsyncClient ---------------------------------------------------------------------------------


def test_async_concurrent_requests_demultiplexed(router):
    prompts = [f"wait {0.01 * (12 - i)} prompt {i}" for i in range(12)]  # later ones answer first

    async def run():
        async with AsyncClient(router.address, timeout=5) as c:
            streams = [c.stream("a long streamed completion"), c.stream("another streamed one")]

            async def consume(s):
                return [chunk async for chunk in s], s.result

            results, *streamed = await asyncio.gather(
                asyncio.gather(*(c.generate(p) for p in prompts)), *(consume(s) for s in streams)
            )
            return results, streamed

    results, streamed = asyncio.run(run())
    assert [r.text for r in results] == [p.upper() for p in prompts]
    assert len({r.request_id for r in results}) == len(prompts)
    for chunks, result in streamed:
        assert "".join(c.text for c in chunks) == result.text
        assert [t for c in chunks for t in c.token_ids] == result.token_ids
    assert router.aborts == []


def test_async_errors_timeouts_and_abort(router):
    async def run():
        async with AsyncClient(router.address) as c:
            with pytest.raises(ServerError) as info:
                await c.generate("overloaded")
            assert (info.value.code, info.value.retry_after) == ("overloaded", 1.5)
            with pytest.raises(InvalidRequest, match="top_k"):
                await c.generate("hi", top_k=-5)
            with pytest.raises(TimeoutError):
                await c.generate("hang", timeout=0.1)
            stream = c.stream("slow")
            async for _ in stream:
                break
            for _ in range(200):
                if len(router.aborts) == 2:
                    break
                await asyncio.sleep(0.01)
            assert router.aborts == [router.submits[1].request_id, stream.request_id]
            assert (await c.generate("stale")).text == "STALE"
            with pytest.raises(ClientError, match="unsupported protocol version"):
                await c.generate("garbled")
            assert await c.ping() > 0 and await c.stats() == READY
            await c.wait_ready(1)
            router.stats = stats_of(worker("p0", "prefill"))
            with pytest.raises(TimeoutError, match="no alive decode worker"):
                await c.wait_ready(0.3)
            cancelled = asyncio.ensure_future(c.generate("hang", request_id="cancel-me"))
            await asyncio.sleep(0.05)
            cancelled.cancel()
            for _ in range(200):
                if router.aborts[-1] == "cancel-me":
                    break
                await asyncio.sleep(0.01)
            assert router.aborts[-1] == "cancel-me"
            pending = asyncio.ensure_future(c.generate("hang"))
            await asyncio.sleep(0.05)
        with pytest.raises(ClientError, match="closed"):
            await pending

    asyncio.run(run())


# --- CLI -----------------------------------------------------------------------------------------


def run_cli(argv: list[str], capsys) -> tuple[int, list[str], list[str]]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_cli_json_results_in_prompt_order(router, capsys, tmp_path):
    code, out, err = run_cli(["client", "--address", router.address, "--prompt", "wait 0.2 first",
                              "--prompt", "zwei", "--json", "--max-tokens", "4"], capsys)
    assert (code, err) == (0, [])
    assert out == [json.dumps({"index": 0, "text": "WAIT 0.2 FIRST", "token_ids": [ord(c) for c in "WAIT 0.2 FIRST"]}),
                   json.dumps({"index": 1, "text": "ZWEI", "token_ids": [90, 87, 69, 73]})]
    assert {s.sampling.max_tokens for s in router.submits} == {4}
    assert {s.sampling.temperature for s in router.submits} == {0.0}  # the CLI's greedy default

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n')
    code, out, _ = run_cli(["client", "--address", router.address, "--prompts", str(path), "--chat"], capsys)
    assert (code, out) == (0, ["[0] A", "[1] B"])
    assert router.submits[-1].chat


def test_cli_error_exit(router, capsys):
    code, out, err = run_cli(["client", "--address", router.address, "--prompt", "fine",
                              "--prompt", "overloaded", "--json"], capsys)
    assert code == 1
    assert out == [json.dumps({"index": 0, "text": "FINE", "token_ids": [70, 73, 78, 69]})]
    assert err == ["pdcluster: error: prompt 1: overloaded: queue is full (retry after 1.5 s)"]


def test_cli_ping(router, capsys):
    assert run_cli(["client", "--address", router.address, "--ping", "--timeout", "2"], capsys) == (0, [], [])
    router.stats = stats_of(worker("d0", "decode"))
    code, out, err = run_cli(["client", "--address", router.address, "--ping", "--timeout", "0.3"], capsys)
    assert code == 2 and out == []
    assert err == [f"pdcluster: error: cluster at {router.address} not ready after 0.3 s: "
                   "no alive prefill worker (1 of 1 known workers alive)"]
    code, out, err = run_cli(["client", "--address", free_address(), "--ping", "--timeout", "0.3"], capsys)
    assert code == 2 and out == [] and len(err) == 1 and "the router did not answer" in err[0]


def test_cli_stats(router, capsys):
    code, out, err = run_cli(["client", "--address", router.address, "--stats"], capsys)
    assert (code, err) == (0, [])
    assert [w["role"] for w in json.loads(out[0])["workers"]] == ["prefill", "decode"]


# --- retries -------------------------------------------------------------------------------------


def flaky(failures: dict[str, int]) -> Script:
    """Refuses each prompt in `failures` that many times (aborted, with no retry hint), then echoes it."""
    def script(submit: Submit) -> list:
        if failures.get(submit.prompt, 0) > 0:
            failures[submit.prompt] -= 1
            return [Error(request_id=submit.request_id, code="aborted", message="decode worker d0 died")]
        return special_prompts(submit)
    return script


def test_retries_resubmit_what_a_resubmit_may_cure():
    router = FakeRouter(script=flaky({"twice": 2, "thrice": 3}))
    try:
        with Client(router.address, timeout=5, retries=2) as c:
            assert c.generate("twice").text == "TWICE"
            ids = [s.request_id for s in router.submits]
            assert len(ids) == 3 and len(set(ids)) == 1  # one request id throughout
            with pytest.raises(ServerError) as e:
                c.generate("thrice")
            assert e.value.code == "aborted" and len(router.submits) == 6
            start = time.monotonic()
            with pytest.raises(ServerError):  # retry_after 1.5 s would pass the deadline: give up at once
                c.generate("overloaded", timeout=1.0)
            assert time.monotonic() - start < 0.5
            with pytest.raises(ServerError):
                c.generate("overloaded", retries=0)
        with Client(router.address, timeout=5) as c:  # retries default to 0
            n = len(router.submits)
            with pytest.raises(ServerError):
                c.generate("overloaded", retries=0)
            assert len(router.submits) == n + 1
    finally:
        router.close()


def test_async_retries():
    router = FakeRouter(script=flaky({"a": 1, "b": 1}))

    async def go():
        async with AsyncClient(router.address, timeout=5, retries=1) as c:
            return await asyncio.gather(c.generate("a"), c.generate("b"), c.generate("c"))

    try:
        assert [r.text for r in asyncio.run(go())] == ["A", "B", "C"]
        assert len(router.submits) == 5
    finally:
        router.close()


def test_cli_against_no_router_fails_within_its_connect_timeout():
    """`pdcluster client --prompt` against an address where nothing listens: one line saying so, a non-zero exit,
    within the connect deadline (it used to hang with no output until killed)."""
    import subprocess
    import sys
    import time

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "scripts.cli", "client", "--address", free_address(), "--prompt", "hi",
                           "--connect-timeout", "1"], capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and proc.stdout == ""
    assert len(lines) == 1 and "no router answered at tcp://127.0.0.1:" in lines[0] and "within 1 s" in lines[0], lines
    assert took < 30


def test_cli_stream_prints_each_completion_as_it_comes(router, capsys):
    code, out, err = run_cli(["client", "--address", router.address, "--prompt", "hello there", "--prompt",
                              "overloaded", "--prompt", "bye", "--stream"], capsys)
    assert (code, out) == (1, ["HELLO THERE", "", "BYE"])
    assert err == ["pdcluster: error: prompt 1: overloaded: queue is full (retry after 1.5 s)"]
    assert all(s.stream for s in router.submits)
    code, _, err = run_cli(["client", "--address", router.address, "--prompt", "x", "--stream", "--json"], capsys)
    assert code == 2 and err == ["pdcluster: error: --stream prints text as it comes: leave out --json"]


def test_async_streaming_leaves_no_reference_cycles(router):
    """A streamed token makes no garbage only the cycle collector frees (a zmq.Again kept in a future did, once a
    batch): at the bench's load such garbage set off full collections, pauses in the client's own loop."""
    prompt = "the same long completion, streamed three letters a delta " * 4

    async def consume(stream) -> int:
        return len([chunk async for chunk in stream])

    async def run():
        async with AsyncClient(router.address, timeout=5) as c:
            await c.ping()
            for _ in range(3):  # the loop's and the client's first-use objects are made by now
                await consume(c.stream(prompt))
            gc.collect()
            gc.disable()
            try:
                deltas = await asyncio.gather(*(consume(c.stream(prompt)) for _ in range(4)))
                return sum(deltas), gc.collect()
            finally:
                gc.enable()

    deltas, cyclic = asyncio.run(run())
    assert deltas == 4 * len(range(0, len(prompt), 3)) and cyclic < 20
