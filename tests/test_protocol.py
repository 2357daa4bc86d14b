from __future__ import annotations

import copy
import math
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Literal

import msgpack
import msgspec
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import Meta

from common import protocol as P
from common.protocol import (
    CLIENT_TO_ROUTER,
    ERROR_CODES,
    MAX_FRAME_BYTES,
    MAX_ID_LEN,
    MAX_LIST_LEN,
    MAX_STR_LEN,
    REGISTRY,
    Abort,
    AbortRequest,
    Alive,
    Delta,
    Error,
    HandoffAck,
    Heartbeat,
    KVDescriptors,
    KVHandoff,
    KVLayout,
    Message,
    NcclDescriptor,
    NcclStream,
    Ping,
    Pong,
    PrefillTask,
    GenerateTask,
    ProtocolError,
    Record,
    Reserve,
    Reserved,
    Result,
    Sampling,
    ScaleReply,
    ScaleRequest,
    Shutdown,
    Stats,
    StatsRequest,
    Submit,
    Timings,
    TokenBatch,
    TokenUpdate,
    Usage,
    WorkerHello,
    WorkerLoad,
    WorkerStats,
    decode,
    encode,
    error_reply,
    field_problem,
)
from common.protocol.schema import Seconds
from common.sampling_params import InvalidRequest, SamplingParams

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"

LAYOUT = KVLayout(block_size=16, num_layers=28, num_kv_heads=8, head_dim=128, dtype="bfloat16")
KV_DESCRIPTORS = KVDescriptors(nccl=NcclDescriptor(backend="nccl", host="10.0.0.2", port=29500, gpu="GPU-1234",
                                                   layout=LAYOUT, num_blocks=4096))
SAMPLING = Sampling(max_tokens=64, temperature=0.7, top_p=0.9, top_k=50, seed=1234, stop_token_ids=[2, 7],
                    ignore_eos=True)

# One instance of every message type, with non-default values wherever possible.
SAMPLES: dict[str, Message] = {
    m.TYPE: m
    for m in [
        Submit(request_id="req-1", prompt="Hello, wörld ✓", chat=True, sampling=SAMPLING, stream=True),
        Abort(request_id="req-1"),
        Ping(nonce=42),
        Pong(nonce=-3),
        StatsRequest(),
        Stats(
            uptime=12.5, requests_in_flight=3, queued_requests=1,
            workers=[
                WorkerStats(worker_id="p0", role="prefill", alive=True, queued_requests=1, queued_tokens=900,
                            running_requests=2, kv_blocks_total=1000, kv_blocks_free=10),
                WorkerStats(worker_id="d0", role="decode", alive=False, queued_requests=0, queued_tokens=0,
                            running_requests=0, kv_blocks_total=0, kv_blocks_free=0, draining=True,
                            node_id="node-b"),
            ],
        ),
        ScaleRequest(role="decode", delta=-1, nonce=9),
        ScaleReply(nonce=9, ok=True, message="removed d1", workers=["d1"]),
        Delta(request_id="req-1", token_ids=[5, 6], text="ab", index=3),
        Result(
            request_id="req-1", token_ids=[1, 2, 3], text="a b", finish_reason="length",
            usage=Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=4),
            timings=Timings(queued=0.001, ttft=0.05, e2e=0.2, itl=[0.01, 0.02]),
        ),
        Error(request_id="req-1", code=P.OVERLOADED, message="queue full", retry_after=1.5),
        WorkerHello(
            worker_id="d0", role="decode", model_fingerprint="qwen3-0.6b:abc123", num_blocks=4096, layout=LAYOUT,
            max_model_len=4096, vocab_size=151936, transports=["host", "nccl"], kv_address="tcp://10.0.0.2:6001",
            kv=KV_DESCRIPTORS, node_id="node-a", device_index=1,
        ),
        Reserve(request_id="req-1", token_ids=[1, 2, 3], sampling=SAMPLING, prefill_worker_id="p0"),
        Reserved(request_id="req-1", block_ids=[7, 8, 9]),
        PrefillTask(
            request_id="req-1", token_ids=[1, 2, 3], sampling=Sampling(), decode_worker_id="d0",
            decode_kv_address="tcp://10.0.0.2:6001", dst_block_ids=[7, 8, 9], transport="nccl",
            decode_kv=KV_DESCRIPTORS,
        ),
        GenerateTask(request_id="req-2", token_ids=[4, 5], sampling=SAMPLING),
        KVHandoff(
            request_id="req-1", src_worker_id="p0", first_token=99, num_tokens=3, transport="nccl",
            dst_block_ids=[7], reply_to="tcp://10.0.0.1:6002", cached_tokens=2,
            nccl=NcclStream(link="a1b2", seq=4, block_bytes=4096, segments=[1]),
        ),
        HandoffAck(request_id="req-1", ok=False, message="layout mismatch"),
        P.OpenLink(decode_worker_id="d0", decode_kv_address="tcp://10.0.0.2:6001", transport="nccl",
                   decode_kv=KV_DESCRIPTORS),
        P.LinkOpened(decode_worker_id="d0", error="timed out"),
        P.KVLinkOpen(src_worker_id="p0", transport="nccl", link="a1b2"),
        TokenBatch(updates=[
            TokenUpdate(request_id="a", token_ids=[1], cached_tokens=16),
            TokenUpdate(request_id="b", token_ids=[], finish_reason="stop"),
        ]),
        Heartbeat(worker_id="d0", load=WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=5,
                                                   kv_blocks_total=100, kv_blocks_free=50, gpu_seconds=1.5)),
        Alive(worker_id="p0", busy_seconds=12.5),
        AbortRequest(request_id="req-1"),
        Shutdown(reason="rolling restart"),
    ]
}

# Records reachable from messages, by the name the doc uses.
RECORDS: dict[str, type] = {
    "Sampling": SamplingParams, "Usage": Usage, "Timings": Timings, "WorkerStats": WorkerStats,
    "WorkerLoad": WorkerLoad, "KVLayout": KVLayout, "TokenUpdate": TokenUpdate, "KVDescriptors": KVDescriptors,
    "CudaIpcDescriptor": P.CudaIpcDescriptor, "CudaIpcPool": P.CudaIpcPool, "NcclDescriptor": NcclDescriptor,
    "NcclStream": NcclStream, "RouterTotals": P.RouterTotals,
}


def fields_of(cls: type) -> list[str]:
    """A record's wire fields (`v`, the envelope's version, is the codec's)."""
    return [name for name in cls.__struct_fields__ if name != "v"]


def wire(**fields: object) -> bytes:
    return msgpack.packb({"v": 1, **fields})


def submit(**fields: object) -> bytes:
    return wire(type="submit", request_id="rid", prompt="hi", **fields)


def fails(frame: object, code: str, request_id: str = "", match: str = "", **kwargs: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(frame, **kwargs)  # type: ignore[arg-type]
    assert info.value.code == code, info.value
    assert info.value.request_id == request_id
    assert match in info.value.message
    return info.value


# --- round trips -------------------------------------------------------------------------------


def test_every_message_type_has_a_sample():
    assert set(SAMPLES) == set(REGISTRY)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_round_trip(name):
    msg = SAMPLES[name]
    out = decode(encode(msg))
    assert type(out) is type(msg)
    assert out == msg
    assert decode(encode(msg), expect=(type(msg),)) == msg


def test_registry_names():
    for name, cls in REGISTRY.items():
        assert cls.TYPE == name
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name)
    directions = set(P.CLIENT_TO_ROUTER + P.ROUTER_TO_CLIENT + P.WORKER_TO_ROUTER + P.ROUTER_TO_WORKER + P.DATA_PLANE)
    assert directions == set(REGISTRY.values())


def test_the_decoder_is_built_at_import_not_on_the_first_frame():
    """Built on a process's first frame, the decoder over every type cost that frame's request milliseconds: the
    first request each worker took (issue 20). A fresh interpreter has it once the package is imported."""
    probe = ("from common.protocol import codec, REGISTRY\n"
             "assert codec._decoder is not None\n"
             "print(len(REGISTRY))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == len(REGISTRY)


def test_envelope_and_omitted_defaults():
    frame = encode(Submit(request_id="a", prompt="x"))
    assert msgpack.unpackb(frame) == {"v": 1, "type": "submit", "request_id": "a", "prompt": "x"}
    assert list(msgpack.unpackb(frame))[:3] == ["v", "type", "request_id"]


def test_minimal_submit_gets_defaults():
    msg = decode(wire(type="submit", request_id="a", token_ids=[1, 2]))
    assert msg == Submit(request_id="a", token_ids=[1, 2])
    assert msg.sampling == SamplingParams() and not msg.chat and not msg.stream


def test_sampling_decodes_to_sampling_params():
    msg = decode(submit(sampling={"temperature": 0, "top_p": 1, "stop_token_ids": [3]}))
    assert type(msg.sampling) is SamplingParams
    assert msg.sampling.temperature == 0.0 and type(msg.sampling.temperature) is float
    assert msg.sampling.greedy and msg.sampling.stop_token_ids == [3]


def test_sampling_wire_fields_are_pinned():
    # Sampling is SamplingParams: a new engine field is a new wire field. Document it, then update this.
    assert list(Sampling.field_names()) == [
        "max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos"
    ]


def test_ints_where_floats_are_expected_become_floats():
    msg = decode(wire(type="result", request_id="r", token_ids=[], text="", finish_reason="stop",
                      usage={"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 0},
                      timings={"queued": 0, "ttft": None, "e2e": 1, "itl": [1, 2.5]}))
    assert msg.timings.e2e == 1.0 and type(msg.timings.e2e) is float
    assert [type(x) for x in msg.timings.itl] == [float, float]


def test_accepts_bytes_like_frames():
    frame = encode(SAMPLES["ping"])
    assert decode(bytearray(frame)) == decode(memoryview(frame)) == SAMPLES["ping"]


def test_messages_are_frozen_and_checked_across_fields_on_construction():
    with pytest.raises(AttributeError):
        SAMPLES["abort"].request_id = "x"  # type: ignore[misc]
    with pytest.raises(InvalidRequest, match="prompt: exactly one of prompt and token_ids"):
        Submit(request_id="r", prompt="x", token_ids=[1])
    with pytest.raises(InvalidRequest, match="delta: must not be 0"):
        ScaleRequest(role="decode", delta=0)
    with pytest.raises(InvalidRequest, match="cached_tokens: more than prompt_tokens"):
        Usage(prompt_tokens=1, completion_tokens=0, cached_tokens=2)
    with pytest.raises(InvalidRequest, match="top_p: must be in"):
        Sampling(top_p=0)


def test_field_constraints_are_checked_when_a_frame_is_decoded():
    """Construction checks only rules across fields (and sampling): the receiving end checks every field."""
    for bad, request_id, match in [
        (Abort(request_id=""), "", "request_id: expected a string of length >= 1"),
        (Delta(request_id="r", token_ids=[1], text="", index=-1), "r", "index: expected an integer >= 0"),
        (TokenBatch(updates=[TokenUpdate(request_id="r", token_ids=[], finish_reason="done")]), "",
         "updates[0].finish_reason: must be one of stop, length, abort; got 'done'"),
    ]:
        fails(encode(bad), "bad_request", request_id, match)


# --- validation failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, code, match",
    [
        (submit(temperature=1.0), "bad_request", "temperature: unknown field"),
        (wire(type="submit", prompt="x"), "bad_request", "request_id: missing required field"),
        (wire(type="submit", request_id="rid"), "bad_request", "exactly one of prompt and token_ids"),
        (wire(type="submit", request_id="rid", prompt="x", token_ids=[1]), "bad_request", "exactly one"),
        (wire(type="submit", request_id="rid", token_ids=[1], chat=True), "bad_request", "chat:"),
        (wire(type="submit", request_id="rid", token_ids=[]),
         "bad_request", "token_ids: expected an array of length >= 1"),
        (wire(type="submit", request_id="rid", token_ids=[1, -1]),
         "bad_request", "token_ids[1]: expected an integer >= 0"),
        (wire(type="submit", request_id="rid", token_ids=[1, 2**31]),
         "bad_request", "token_ids[1]: expected an integer <= 2147483647"),
        (wire(type="submit", request_id="rid", token_ids=[1, 2.0]), "bad_request", "token_ids[1]: expected an integer"),
        (wire(type="submit", request_id="rid", token_ids=[True]), "bad_request", "token_ids[0]: expected an integer"),
        (submit(stream=1), "bad_request", "stream: expected a boolean, got an integer"),
        (submit(sampling={"max_tokens": True}),
         "bad_request", "sampling.max_tokens: expected an integer, got a boolean"),
        (submit(sampling={"max_tokens": "5"}), "bad_request", "sampling.max_tokens: expected an integer, got a string"),
        (submit(sampling={"max_tokens": 0}), "bad_request", "sampling.max_tokens: must be a positive integer"),
        (submit(sampling={"temperature": math.nan}),
         "bad_request", "sampling.temperature: must be a finite number >= 0, got nan"),
        (submit(sampling={"temperature": math.inf}),
         "bad_request", "sampling.temperature: must be a finite number >= 0, got inf"),
        (submit(sampling={"top_p": 2}), "bad_request", "sampling.top_p: must be in (0, 1]"),
        (submit(sampling={"top_k": -2}), "bad_request", "sampling.top_k"),
        (submit(sampling={"seed": 2**63}), "bad_request", "sampling.seed"),
        (submit(sampling={"top_q": 1}), "bad_request", "sampling.top_q: unknown field"),
        (submit(sampling=[1]), "bad_request", "sampling: expected a map, got an array"),
        (submit(sampling=None), "bad_request", "sampling: expected a map, got nil"),
        (submit(**{"x" * 500: 1}), "bad_request", "x" * 64 + ": unknown field"),
        (wire(type="submit", request_id="rid", prompt=b"bytes"),
         "bad_request", "prompt: expected a string or nil, got binary"),
        (wire(type="submit", request_id="rid", prompt=msgpack.ExtType(1, b"x")),
         "bad_request", "prompt: expected a string or nil, got an extension type"),
        (wire(type="ping", nonce=1.5), "bad_request", "nonce: expected an integer or nil, got a number"),
        (wire(type="error", request_id="r", code="nope", message=""), "bad_request", "code: must be one of"),
        (wire(type="result", request_id="r", token_ids=[], text="", finish_reason="stop",
              usage={"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 2},
              timings={"queued": 0, "ttft": None, "e2e": 0, "itl": []}), "bad_request", "usage.cached_tokens"),
        (wire(type="result", request_id="r", token_ids=[], text="", finish_reason="stop",
              usage={"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 0},
              timings={"queued": -1.0, "ttft": None, "e2e": 0, "itl": []}),
         "bad_request", "timings.queued: expected a number >= 0.0"),
        (wire(type="token_batch",
              updates=[{"request_id": "a", "token_ids": []}, {"request_id": "b", "token_ids": "x"}]),
         "bad_request", "updates[1].token_ids: expected an array"),
        (wire(type="stats_request", extra=1), "bad_request", "extra: unknown field"),
        (wire(type="scale_request", role="decode", delta=0), "bad_request", "delta: must not be 0"),
        (wire(type="scale_request", role="decode", delta=65), "bad_request", "delta: expected an integer <= 64"),
        (wire(type="scale_request", role="router", delta=1), "bad_request", "role: must be one of"),
    ],
)
def test_invalid_fields(frame, code, match):
    error = fails(frame, code, request_id=msgpack.unpackb(frame).get("request_id", ""), match=match)
    assert error_reply(error).code == code


def test_bytes_keys_are_unknown_fields():
    fails(msgpack.packb({"v": 1, "type": "ping", b"nonce": 1}), "bad_request",
          match="key: expected a string, got binary")


@pytest.mark.parametrize("version", [2, 0, "1", 1.0, True, None, [1]])
def test_wrong_version(version):
    fails(msgpack.packb({"v": version, "type": "abort", "request_id": "rid"}), "unsupported_version", "rid")


def test_missing_version():
    fails(msgpack.packb({"type": "abort", "request_id": "rid"}), "unsupported_version", "rid", "missing")


def test_type_problems():
    fails(wire(request_id="rid"), "bad_request", "rid", "type:")
    fails(wire(type=7, request_id="rid"), "bad_request", "rid", "type:")
    fails(wire(type="frobnicate", request_id="rid"), "unknown_type", "rid", "frobnicate")
    fails(encode(Reserved(request_id="rid", block_ids=[])), "unknown_type", "rid", "not accepted",
          expect=CLIENT_TO_ROUTER)


@pytest.mark.parametrize(
    "frame",
    [b"", b"\xc1", b"\x91", b"\x01\x02", b"\x91" * 5000 + b"\x01", b"\x81\x91\x01\x01", b"\x81\x01\x01",
     msgpack.packb([1, 2]), msgpack.packb("submit"), msgpack.packb(None), b"\xd4\xff\x00"],
)
def test_not_a_map_of_msgpack(frame):
    fails(frame, "bad_request")


@pytest.mark.parametrize("frame", [None, "a string", 12, object()])
def test_not_bytes(frame):
    fails(frame, "bad_request", match="must be bytes")


def test_invalid_utf8():
    fails(b"\x83\xa1v\x01\xa4type\xa5abort\xaarequest_id\xa2\xff\xfe", "bad_request", match="UTF-8")
    # Elsewhere in the frame: request_id is still recovered.
    frame = b"\x84\xa1v\x01\xa4type\xa6submit\xa6prompt\xa2\xc3\x28\xaarequest_id\xa3rid"
    fails(frame, "bad_request", "rid", "UTF-8")
    # Lone surrogate (CESU-style) is not UTF-8 either.
    fails(b"\x84\xa1v\x01\xa4type\xa6submit\xaarequest_id\xa3rid\xa6prompt\xa3\xed\xa0\x80", "bad_request", "rid")


def test_request_id_recovered_only_when_valid():
    fails(wire(type="abort", request_id="x" * (MAX_ID_LEN + 1)), "too_large", "", "request_id:")
    fails(wire(type="abort", request_id=5), "bad_request", "", "request_id:")
    fails(wire(type="abort", request_id=""), "bad_request", "", "request_id:")
    fails(wire(type="abort", request_id="x" * MAX_ID_LEN, bogus=1), "bad_request", "x" * MAX_ID_LEN)


def test_error_reply_from_protocol_error():
    error = fails(submit(sampling={"top_p": 0}), "bad_request", "rid")
    reply = error_reply(error, retry_after=None)
    assert decode(encode(reply)) == Error(request_id="rid", code="bad_request", message=error.message)


# --- limits ------------------------------------------------------------------------------------


def big_submit(prompt_bytes: int) -> bytes:
    """A submit frame whose prompt is `prompt_bytes` of UTF-8 (3-byte characters, ASCII to pad)."""
    prompt = "€" * (prompt_bytes // 3) + "a" * (prompt_bytes % 3)
    return msgpack.packb({"v": 1, "type": "submit", "request_id": "big", "prompt": prompt})


def test_frame_at_and_just_over_the_limit():
    overhead = len(big_submit(70_000)) - 70_000  # str32 header from 64 KiB on
    at_limit = big_submit(MAX_FRAME_BYTES - overhead)
    assert len(at_limit) == MAX_FRAME_BYTES
    assert len(decode(at_limit).prompt.encode()) == MAX_FRAME_BYTES - overhead
    over = big_submit(MAX_FRAME_BYTES - overhead + 1)
    assert len(over) == MAX_FRAME_BYTES + 1
    fails(over, "too_large", "big", "frame is")


def test_encode_refuses_too_large_frames():
    with pytest.raises(ProtocolError) as info:
        encode(Submit(request_id="big", prompt="€" * (MAX_FRAME_BYTES // 3)))
    assert (info.value.code, info.value.request_id) == ("too_large", "big")


def test_list_length_limit():
    assert len(decode(wire(type="submit", request_id="rid", token_ids=[1] * MAX_LIST_LEN)).token_ids) == MAX_LIST_LEN
    fails(wire(type="submit", request_id="rid", token_ids=[1] * (MAX_LIST_LEN + 1)), "too_large", "rid")
    fails(wire(type="worker_hello", worker_id="w", role="decode", model_fingerprint="m", num_blocks=1,
               layout=msgspec.to_builtins(LAYOUT), max_model_len=8, vocab_size=8, transports=["host"] * 17),
          "too_large", match="transports: expected an array of length <= 16")


def test_string_length_limit():
    assert len(decode(wire(type="submit", request_id="rid", prompt="a" * MAX_STR_LEN)).prompt) == MAX_STR_LEN
    fails(wire(type="submit", request_id="rid", prompt="a" * (MAX_STR_LEN + 1)), "too_large", "rid", "prompt:")


def test_maps_and_containers_beyond_the_schema_are_refused_at_once():
    """Every map is a record whose keys are known fields, and no field holds arbitrary data: a frame cannot make
    the receiver build a large or deep structure before it is refused."""
    many_keys = wire(type="ping", **{f"k{i}": 0 for i in range(100_000)})
    nested = wire(type="ping", nonce=[[] for _ in range(100_000)])
    deep = b"\x84\xa1v\x01\xa4type\xa4ping\xa5nonce\x01\xa1x" + b"\x91" * 100_000 + b"\x01"
    for frame, match in [(many_keys, "k0: unknown field"), (nested, "nonce: expected an integer or nil, got an array"),
                         (deep, "x: unknown field")]:
        start = time.perf_counter()
        fails(frame, "bad_request", match=match)
        assert time.perf_counter() - start < 0.5


def test_a_tiny_frame_cannot_claim_a_huge_array():
    fails(b"\xdd\x7f\xff\xff\xff", "bad_request", match="a frame must be a msgpack map")  # array32 of 2**31 - 1
    fails(b"\xdb\x7f\xff\xff\xff", "bad_request", match="truncated")  # str32 header claiming 2 GiB
    inside = b"\x83\xa1v\x01\xa4type\xa4ping\xa5nonce\xdd\x7f\xff\xff\xff"
    fails(inside, "bad_request", match="nonce: expected an integer or nil, got an array")


# --- fuzzing -----------------------------------------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20)
)
structures = st.recursive(
    scalars,
    lambda inner: (st.lists(inner, max_size=6)
                   | st.dictionaries(st.text(max_size=12) | st.binary(max_size=4), inner, max_size=6)),
    max_leaves=40,
)


@st.composite
def message_like(draw: st.DrawFn) -> dict[object, object]:
    """A map that looks like a message: a real type, some of its real fields, arbitrary values."""
    cls = draw(st.sampled_from(sorted(REGISTRY.values(), key=lambda c: c.TYPE)))
    names = fields_of(cls)
    body: dict[object, object] = {"v": draw(st.sampled_from([1, 1, 1, 2, True, None])), "type": cls.TYPE}
    for name in names:
        if draw(st.booleans()):
            body[name] = draw(st.one_of(structures, st.just(None)) | st.integers(-5, 5) | st.lists(st.integers(0, 9)))
    return body


def check_decode(frame: bytes) -> None:
    try:
        msg = decode(frame)
    except ProtocolError as exc:
        assert exc.code in ERROR_CODES
        assert decode(encode(error_reply(exc))) == error_reply(exc)  # always a valid, sendable reply
    else:
        assert decode(encode(msg)) == msg


FUZZ = settings(max_examples=400, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(frame):
    check_decode(frame)


@FUZZ
@given(structures)
def test_fuzz_arbitrary_msgpack(value):
    check_decode(msgpack.packb(value))


@FUZZ
@given(message_like())
def test_fuzz_message_like_maps(body):
    check_decode(msgpack.packb(body))


@FUZZ
@given(st.sampled_from(sorted(SAMPLES)), st.data())
def test_fuzz_corrupted_valid_frames(name, data):
    frame = bytearray(encode(SAMPLES[name]))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    check_decode(bytes(frame[:cut]))


@settings(max_examples=200, deadline=timedelta(seconds=2))
@given(
    st.text(min_size=1, max_size=MAX_ID_LEN),
    st.one_of(st.text(max_size=200).map(lambda s: ("prompt", s)),
              st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50).map(lambda t: ("token_ids", t))),
    st.builds(SamplingParams, max_tokens=st.integers(1, 10**6), temperature=st.floats(0, 10),
              top_p=st.floats(0.01, 1), top_k=st.integers(-1, 1000), seed=st.none() | st.integers(0, 2**63 - 1),
              stop_token_ids=st.lists(st.integers(0, 10**6), max_size=5), ignore_eos=st.booleans()),
    st.booleans(),
)
def test_fuzz_valid_submits_round_trip(request_id, prompt, sampling, stream):
    msg = Submit(request_id=request_id, sampling=sampling, stream=stream, **{prompt[0]: prompt[1]})
    assert decode(encode(msg), expect=CLIENT_TO_ROUTER) == msg


# --- the schema's field grammar and its error text, on a record no message uses ------------------


class Blob(Record, kw_only=True):
    data: Annotated[bytes, Meta(max_length=4)] = b""
    names: list[Literal["a", "b"]] = []
    scores: list[Seconds] | None = None
    inner: Usage | None = None


def blob(**fields: object) -> Blob:
    """`fields` through the wire, as a receiver would decode them; a failure is (code, message) as decode says."""
    try:
        return msgspec.msgpack.decode(msgpack.packb(fields), type=Blob)
    except msgspec.ValidationError as exc:
        raise ProtocolError(*field_problem(str(exc))) from None


def test_generic_grammar_accepts_and_normalizes():
    b = blob(data=b"ab", names=["a", "b"], scores=[1, 2.5],
             inner={"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0})
    assert b.scores == [1.0, 2.5] and type(b.scores[0]) is float
    assert b.inner == Usage(prompt_tokens=1, completion_tokens=1, cached_tokens=0)


@pytest.mark.parametrize(
    "fields, code, match",
    [
        ({"data": "ab"}, "bad_request", "data: expected binary, got a string"),
        ({"data": b"12345"}, "too_large", "data: expected binary of length <= 4"),
        ({"names": ["c"]}, "bad_request", "names[0]: invalid enum value 'c'"),
        ({"scores": [math.nan]}, "bad_request", "scores[0]: expected a number >= 0"),
        ({"scores": [math.inf]}, "bad_request", "scores[0]: expected a number <= "),
        ({"inner": {"prompt_tokens": 1}}, "bad_request", "inner.completion_tokens: missing required field"),
        ({"inner": {"prompt_tokens": 1, "completion_tokens": 0, "cached_tokens": 2}}, "bad_request",
         "inner.cached_tokens: more than prompt_tokens"),
    ],
)
def test_generic_grammar_rejects(fields, code, match):
    with pytest.raises(ProtocolError) as info:
        blob(**fields)
    assert info.value.code == code and match in info.value.message, info.value


def test_protocol_error_basics():
    exc = ProtocolError("timeout", "too slow", "r1")
    assert str(exc) == "timeout: too slow"
    clone = copy.deepcopy(exc)  # the same mechanism Ray uses to ship exceptions
    assert (clone.code, clone.message, clone.request_id) == ("timeout", "too slow", "r1")
    with pytest.raises(ValueError):
        ProtocolError("teapot", "no")
    long = error_reply(ProtocolError("internal", "x" * 10_000))
    assert len(long.message) == P.MAX_MESSAGE_LEN


def test_encode_rejects_non_messages_and_mutated_messages():
    with pytest.raises(TypeError):
        encode(LAYOUT)  # type: ignore[arg-type]
    msg = Delta(request_id="rid", token_ids=[1], text="", index=0)
    msg.token_ids.append(object())  # lists are not copied: "frozen-ish"
    with pytest.raises(ProtocolError) as info:
        encode(msg)
    assert (info.value.code, info.value.request_id) == ("internal", "rid")


# --- docs/protocol.md stays in sync ---------------------------------------------------------------


def doc_sections() -> dict[str, str]:
    """Heading line -> the text under it, up to the next heading."""
    parts = re.split(r"^(#{1,6} .*)$", DOC.read_text(), flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}


def section_for(key: str) -> str:
    matches = [body for heading, body in doc_sections().items() if f"`{key}`" in heading]
    assert len(matches) == 1, f"docs/protocol.md needs exactly one heading with `{key}`"
    return matches[0]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_message_is_documented(name):
    body = section_for(name)
    for field in fields_of(REGISTRY[name]):
        assert f"| `{field}` |" in body, f"{name}.{field} is not in docs/protocol.md"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_every_record_is_documented(name):
    body = section_for(name)
    inherited = set(fields_of(WorkerLoad)) if RECORDS[name] is WorkerStats else set()  # documented once, as WorkerLoad
    for field in fields_of(RECORDS[name]):
        if field not in inherited:
            assert f"| `{field}` |" in body, f"{name}.{field} is not in docs/protocol.md"


def test_error_codes_and_byte_example_are_documented():
    errors = doc_sections()["## Errors"]
    for code in ERROR_CODES:
        assert f"| `{code}` |" in errors
    hexdump = re.search(r"```\n([0-9a-f ]+)\n```", doc_sections()["## Byte-level example"]).group(1)
    assert bytes.fromhex(hexdump) == encode(Ping(nonce=7))


def test_example_client_runs_against_a_router(tmp_path):
    code = re.search(r"<!-- example-client -->\n```python\n(.*?)```", DOC.read_text(), flags=re.S).group(1)
    assert "pdcluster" not in code and "common" not in code
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    assert P.DEFAULT_ROUTER_ADDRESS in code
    code = code.replace(P.DEFAULT_ROUTER_ADDRESS, f"tcp://127.0.0.1:{port}")

    def serve() -> None:
        if not router.poll(20_000):
            return
        identity, frame = router.recv_multipart()
        req = decode(frame, expect=CLIENT_TO_ROUTER)
        assert isinstance(req, Submit) and req.stream and req.sampling.max_tokens == 32
        for msg in [
            Pong(nonce=1),
            Delta(request_id="someone-else", token_ids=[9], text="nope", index=0),
            Delta(request_id=req.request_id, token_ids=[11], text=" Par", index=0),
            Delta(request_id=req.request_id, token_ids=[12], text="is", index=1),
            Result(request_id=req.request_id, token_ids=[11, 12], text=" Paris", finish_reason="stop",
                   usage=Usage(prompt_tokens=5, completion_tokens=2, cached_tokens=0),
                   timings=Timings(queued=0, ttft=0.1, e2e=0.2, itl=[0.1])),
        ]:
            router.send_multipart([identity, encode(msg)])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    finally:
        server.join(timeout=5)
        router.close()
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(" Paris\n[stop]")
