"""The pdcluster wire protocol: every record that crosses a socket, and its validation.

A record is one msgpack map in one ZMQ frame: ``{"v": 1, "type": <name>, **fields}``. Each message
type is a frozen dataclass below; its field annotations (plus ``wire_field`` constraints) are the
schema. ``decode`` turns untrusted bytes into a validated message or raises ``ProtocolError`` and
nothing else; ``encode`` does the reverse. docs/protocol.md describes the same thing in prose and
tests/test_protocol.py keeps the two in sync.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from types import MappingProxyType, NoneType, UnionType
from typing import Any, ClassVar, Union, get_args, get_origin, get_type_hints

import msgpack

from common.sampling_params import InvalidRequest, SamplingParams

PROTOCOL_VERSION = 1
DEFAULT_ROUTER_ADDRESS = "tcp://127.0.0.1:5555"

# Limits. Exceeding one is `too_large`; every other broken constraint is `bad_request`.
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_LIST_LEN = 1_000_000  # items in any array (e.g. token ids)
MAX_STR_LEN = 4 * 1024 * 1024  # code points in any string without a tighter limit
MAX_MAP_LEN = 1024  # entries in any map
MAX_CONTAINERS = 100_000  # maps + arrays in one frame: memory stays a small multiple of the frame
MAX_ID_LEN = 128  # request and worker ids
MAX_MESSAGE_LEN = 4096  # human-readable error text
MAX_TOKEN_ID = 2**31 - 1
MAX_SCALE_DELTA = 64  # workers one scale_request may add or remove
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack can carry

# Error codes: a closed set. docs/protocol.md says what each means to a client.
BAD_REQUEST = "bad_request"
UNSUPPORTED_VERSION = "unsupported_version"
UNKNOWN_TYPE = "unknown_type"
TOO_LARGE = "too_large"
NOT_FOUND = "not_found"
OVERLOADED = "overloaded"
UNAVAILABLE = "unavailable"
TIMEOUT = "timeout"
ABORTED = "aborted"
UNAUTHORIZED = "unauthorized"
INTERNAL = "internal"
ERROR_CODES = (
    BAD_REQUEST, UNSUPPORTED_VERSION, UNKNOWN_TYPE, TOO_LARGE, NOT_FOUND, OVERLOADED,
    UNAVAILABLE, TIMEOUT, ABORTED, UNAUTHORIZED, INTERNAL,
)

ROLES = ("prefill", "decode", "colocated")
FINISH_REASONS = ("stop", "length", "abort")


class ProtocolError(Exception):
    """A frame or message that breaks the protocol. `request_id` is "" when it could not be recovered."""

    def __init__(self, code: str, message: str, request_id: str = "") -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        # args are the constructor's arguments so the exception survives Ray's serialization.
        super().__init__(code, message, request_id)
        self.code = code
        self.message = message
        self.request_id = request_id

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_error(self, retry_after: float | None = None) -> Error:
        """The `Error` reply to send back to the peer that caused this."""
        return Error(
            request_id=self.request_id,
            code=self.code,
            message=self.message[:MAX_MESSAGE_LEN],
            retry_after=retry_after,
        )


def _bad(path: str, problem: str) -> ProtocolError:
    return ProtocolError(BAD_REQUEST, f"{path}: {problem}")


def _join(path: str, text: str) -> str:
    return f"{path}.{text}" if path else text


def _show(value: object, width: int = 40) -> str:
    """A short, safe description of an untrusted value (never the repr of a whole structure)."""
    if value is None:
        return "nil"
    if isinstance(value, (str, bytes)):
        return repr(value[:width]) + ("..." if len(value) > width else "")
    if isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    return f"a {type(value).__name__}"


def _key_text(key: object) -> str:
    return key[:64] if isinstance(key, str) else f"<{_show(key)}>"


# --- field constraints ---------------------------------------------------------------------------

_LIMITS = "pdcluster.protocol"


@dataclass(frozen=True)
class _Limits:
    ge: float | None = None  # numbers; for a list of numbers, each item
    le: float | None = None
    min_len: int = 0  # strings (code points), binaries, lists, maps
    max_len: int | None = None  # None: the global limit for the kind
    choices: tuple[str, ...] | None = None  # strings; for a list of strings, each item


_NO_LIMITS = _Limits()


def wire_field(
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | Any = MISSING,
    ge: float | None = None,
    le: float | None = None,
    min_len: int = 0,
    max_len: int | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A dataclass field with wire constraints; no default means the field is required."""
    limits = _Limits(ge, le, min_len, max_len, choices)
    return dataclasses.field(default=default, default_factory=factory, metadata={_LIMITS: limits})


def _id(default: Any = MISSING) -> Any:
    return wire_field(default, min_len=1, max_len=MAX_ID_LEN)


def _count(default: Any = MISSING) -> Any:
    return wire_field(default, ge=0)


def _token_ids(min_len: int = 0) -> Any:
    return wire_field(min_len=min_len, ge=0, le=MAX_TOKEN_ID)


# --- checkers: one per annotation, compiled once per class ---------------------------------------
# A checker takes (value, path), returns the normalized value, or raises ProtocolError.

_Check = Callable[[Any, str], Any]


def _range_text(lo: float, hi: float) -> str:
    if hi == _INT_MAX or hi == math.inf:
        return f">= {lo}"
    if lo == _INT_MIN or lo == -math.inf:
        return f"<= {hi}"
    return f"in [{lo}, {hi}]"


def _check_len(n: int, limits: _Limits, global_max: int, path: str, unit: str) -> None:
    most = global_max if limits.max_len is None else limits.max_len
    if n > most:
        raise ProtocolError(TOO_LARGE, f"{path}: {n} {unit}, more than the limit of {most}")
    if n < limits.min_len:
        raise _bad(path, f"needs at least {limits.min_len} {unit}, got {n}")


def _int_checker(limits: _Limits) -> _Check:
    lo = _INT_MIN if limits.ge is None else limits.ge
    hi = _INT_MAX if limits.le is None else limits.le

    def check(value: Any, path: str) -> int:
        if type(value) is not int:  # bool is not an int on the wire
            raise _bad(path, f"expected an integer, got {_show(value)}")
        if not lo <= value <= hi:
            raise _bad(path, f"must be {_range_text(lo, hi)}, got {value}")
        return value

    return check


def _float_checker(limits: _Limits) -> _Check:
    lo = -math.inf if limits.ge is None else limits.ge
    hi = math.inf if limits.le is None else limits.le

    def check(value: Any, path: str) -> float:
        if type(value) is int:
            value = float(value)
        elif type(value) is not float:
            raise _bad(path, f"expected a number, got {_show(value)}")
        if not math.isfinite(value):
            raise _bad(path, f"must be finite, got {value}")
        if not lo <= value <= hi:
            raise _bad(path, f"must be {_range_text(lo, hi)}, got {value}")
        return value

    return check


def _check_bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise _bad(path, f"expected a boolean, got {_show(value)}")
    return value


def _str_checker(limits: _Limits) -> _Check:
    def check(value: Any, path: str) -> str:
        if type(value) is not str:
            raise _bad(path, f"expected a string, got {_show(value)}")
        _check_len(len(value), limits, MAX_STR_LEN, path, "characters")
        if limits.choices is not None and value not in limits.choices:
            raise _bad(path, f"must be one of {', '.join(limits.choices)}; got {_show(value)}")
        return value

    return check


def _bytes_checker(limits: _Limits) -> _Check:
    def check(value: Any, path: str) -> bytes:
        if type(value) is not bytes:
            raise _bad(path, f"expected binary, got {_show(value)}")
        _check_len(len(value), limits, MAX_FRAME_BYTES, path, "bytes")
        return value

    return check


def _optional_checker(inner: _Check) -> _Check:
    def check(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    return check


def _list_checker(item_type: Any, limits: _Limits) -> _Check:
    item_limits = _Limits(ge=limits.ge, le=limits.le, choices=limits.choices)
    item = _checker(item_type, item_limits)
    lo = _INT_MIN if limits.ge is None else limits.ge
    hi = _INT_MAX if limits.le is None else limits.le

    def check(value: Any, path: str) -> list[Any]:
        if type(value) is not list:
            raise _bad(path, f"expected an array, got {_show(value)}")
        _check_len(len(value), limits, MAX_LIST_LEN, path, "items")
        # Token-id lists can hold a million items: check them in C-speed passes, no copy.
        if item_type is int and set(map(type, value)) <= {int}:
            if not value or (lo <= min(value) and max(value) <= hi):
                return value
        return [item(x, f"{path}[{i}]") for i, x in enumerate(value)]

    return check


def _dict_checker(value_type: Any, limits: _Limits) -> _Check:
    value_check = _checker(value_type, _NO_LIMITS)
    key_check = _str_checker(_Limits(max_len=MAX_ID_LEN))

    def check(value: Any, path: str) -> dict[str, Any]:
        if type(value) is not dict:
            raise _bad(path, f"expected a map, got {_show(value)}")
        _check_len(len(value), limits, MAX_MAP_LEN, path, "entries")
        out = {}
        for key, item in value.items():
            key_check(key, f"{path} key")
            out[key] = value_check(item, f"{path}[{key!r}]")
        return out

    return check


def _record_checker(cls: type) -> _Check:
    def check(value: Any, path: str) -> Any:
        if isinstance(value, cls):
            return value  # validated when it was constructed
        if type(value) is not dict:
            raise _bad(path, f"expected a map, got {_show(value)}")
        return _build(cls, value, path)

    return check


def _checker(annotation: Any, limits: _Limits) -> _Check:
    if annotation is bool:
        return _check_bool
    if annotation is int:
        return _int_checker(limits)
    if annotation is float:
        return _float_checker(limits)
    if annotation is str:
        return _str_checker(limits)
    if annotation is bytes:
        return _bytes_checker(limits)
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, UnionType) and len(args) == 2 and NoneType in args:
        inner = args[0] if args[1] is NoneType else args[1]
        return _optional_checker(_checker(inner, limits))
    if origin is list:
        return _list_checker(args[0], limits)
    if origin is dict and args[0] is str:
        return _dict_checker(args[1], limits)
    if dataclasses.is_dataclass(annotation):
        return _record_checker(annotation)
    raise TypeError(f"no wire representation for {annotation!r}")


@dataclass(frozen=True)
class _Field:
    name: str
    check: _Check
    default: Any  # MISSING when required; compared against to omit defaults on encode

    @property
    def required(self) -> bool:
        return self.default is MISSING


@dataclass(frozen=True)
class _Schema:
    fields: tuple[_Field, ...]
    by_name: Mapping[str, _Field]


@functools.cache
def _schema(cls: type) -> _Schema:
    hints = get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        limits = f.metadata.get(_LIMITS, _NO_LIMITS)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        fields.append(_Field(f.name, _checker(hints[f.name], limits), default))
    return _Schema(tuple(fields), {f.name: f for f in fields})


def _build(cls: type, data: dict[Any, Any], path: str = "") -> Any:
    """Construct record `cls` from a wire map (already unpacked), validating every field."""
    schema = _schema(cls)
    for key in data:
        if key not in schema.by_name:
            raise _bad(_join(path, _key_text(key)), "unknown field")
    for f in schema.fields:
        if f.required and f.name not in data:
            raise _bad(_join(path, f.name), "missing required field")
    try:
        if issubclass(cls, Record):
            return cls(**data)  # Record.__post_init__ checks the fields
        return cls(**{name: schema.by_name[name].check(v, name) for name, v in data.items()})
    except ProtocolError as exc:
        raise ProtocolError(exc.code, _join(path, exc.message)) from None
    except InvalidRequest as exc:  # SamplingParams' own range checks
        raise ProtocolError(BAD_REQUEST, _join(path, str(exc))) from None


def _to_wire(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in _schema(type(value)).fields:
            item = getattr(value, f.name)
            if f.required or item != f.default:  # an omitted field means "the default"
                out[f.name] = _to_wire(item)
        return out
    if type(value) is list and value and dataclasses.is_dataclass(value[0]):
        return [_to_wire(x) for x in value]
    if type(value) is dict:
        return {k: _to_wire(v) for k, v in value.items()}
    return value


# --- records and the registry --------------------------------------------------------------------


class Record:
    """Base of every wire record: construction validates and normalizes the fields.

    Subclasses are frozen dataclasses; the lists they hold are not copied, so treat them as read-only.
    """

    def __post_init__(self) -> None:
        for f in _schema(type(self)).fields:
            value = getattr(self, f.name)
            checked = f.check(value, f.name)
            if checked is not value:
                object.__setattr__(self, f.name, checked)  # e.g. int -> float
        self._check()

    def _check(self) -> None:
        """Rules across fields; raise `_bad(field, problem)`."""


_REGISTRY: dict[str, type[Message]] = {}
REGISTRY: Mapping[str, type[Message]] = MappingProxyType(_REGISTRY)


class Message(Record):
    """A top-level record; `TYPE` is its `type` on the wire."""

    TYPE: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("TYPE")
        if not isinstance(name, str):
            raise TypeError(f"{cls.__name__} must set TYPE")
        if name in _REGISTRY:
            raise TypeError(f"message type {name!r} is defined twice")
        _REGISTRY[name] = cls


# The wire record for sampling *is* the engine's SamplingParams: one set of defaults and checks.
Sampling = SamplingParams


@dataclass(frozen=True, kw_only=True)
class Usage(Record):
    prompt_tokens: int = _count()
    completion_tokens: int = _count()
    cached_tokens: int = _count()

    def _check(self) -> None:
        if self.cached_tokens > self.prompt_tokens:
            raise _bad("cached_tokens", "more than prompt_tokens")


@dataclass(frozen=True, kw_only=True)
class Timings(Record):
    """Seconds, measured at the router."""

    queued: float = wire_field(ge=0)
    ttft: float | None = wire_field(ge=0)  # None when no token was produced
    e2e: float = wire_field(ge=0)
    itl: list[float] = wire_field(ge=0)


@dataclass(frozen=True, kw_only=True)
class WorkerLoad(Record):
    queued_requests: int = _count()
    queued_tokens: int = _count()
    running_requests: int = _count()
    kv_blocks_total: int = _count()
    kv_blocks_free: int = _count()
    # Since the worker started, over the engine steps that ran (or collected) a batch: their number, their
    # wall time, the tokens they ran and the GPU time of their batches. Differences over a time span give
    # its mean step time and batch, and how busy the GPU was.
    busy_steps: int = _count(0)
    busy_seconds: float = wire_field(0.0, ge=0)
    prefill_tokens_run: int = _count(0)
    decode_tokens_run: int = _count(0)
    gpu_seconds: float = wire_field(0.0, ge=0)

    def _check(self) -> None:
        if self.kv_blocks_free > self.kv_blocks_total:
            raise _bad("kv_blocks_free", "more than kv_blocks_total")


@dataclass(frozen=True, kw_only=True)
class WorkerStats(WorkerLoad):
    worker_id: str = _id()
    role: str = wire_field(choices=ROLES)
    alive: bool
    draining: bool = False  # being removed: gets no new requests, finishes the ones it has
    node_id: str = wire_field("", max_len=MAX_ID_LEN)


@dataclass(frozen=True, kw_only=True)
class KVLayout(Record):
    """What a peer needs to interpret the bytes of one KV block (see docs/design.md)."""

    block_size: int = wire_field(ge=1)
    num_layers: int = wire_field(ge=1)
    num_kv_heads: int = wire_field(ge=1)
    head_dim: int = wire_field(ge=1)
    dtype: str = wire_field(min_len=1, max_len=32)


@dataclass(frozen=True, kw_only=True)
class TokenUpdate(Record):
    request_id: str = _id()
    token_ids: list[int] = _token_ids()
    finish_reason: str | None = wire_field(None, choices=FINISH_REASONS)
    cached_tokens: int = _count(0)


# --- client <-> router ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Submit(Message):
    TYPE = "submit"
    request_id: str = _id()
    prompt: str | None = None
    token_ids: list[int] | None = wire_field(None, min_len=1, ge=0, le=MAX_TOKEN_ID)
    chat: bool = False
    sampling: Sampling = wire_field(factory=Sampling)
    stream: bool = False

    def _check(self) -> None:
        if (self.prompt is None) == (self.token_ids is None):
            raise _bad("prompt", "exactly one of prompt and token_ids must be given")
        if self.chat and self.prompt is None:
            raise _bad("chat", "the chat template applies to a prompt, not to token_ids")


@dataclass(frozen=True, kw_only=True)
class Abort(Message):
    TYPE = "abort"
    request_id: str = _id()


@dataclass(frozen=True, kw_only=True)
class Ping(Message):
    TYPE = "ping"
    nonce: int | None = None


@dataclass(frozen=True, kw_only=True)
class Pong(Message):
    TYPE = "pong"
    nonce: int | None = None


@dataclass(frozen=True, kw_only=True)
class StatsRequest(Message):
    TYPE = "stats_request"


@dataclass(frozen=True, kw_only=True)
class Stats(Message):
    TYPE = "stats"
    uptime: float = wire_field(ge=0)
    requests_in_flight: int = _count()
    queued_requests: int = _count()
    workers: list[WorkerStats] = wire_field()


@dataclass(frozen=True, kw_only=True)
class ScaleRequest(Message):
    TYPE = "scale_request"
    role: str = wire_field(choices=ROLES)
    delta: int = wire_field(ge=-MAX_SCALE_DELTA, le=MAX_SCALE_DELTA)
    nonce: int | None = None

    def _check(self) -> None:
        if self.delta == 0:
            raise _bad("delta", "must not be 0")


@dataclass(frozen=True, kw_only=True)
class ScaleReply(Message):
    TYPE = "scale_reply"
    nonce: int | None = None
    ok: bool
    message: str = wire_field("", max_len=MAX_MESSAGE_LEN)
    workers: list[str] = wire_field(factory=list, max_len=MAX_SCALE_DELTA)  # the ids started or removed


@dataclass(frozen=True, kw_only=True)
class Delta(Message):
    TYPE = "delta"
    request_id: str = _id()
    token_ids: list[int] = _token_ids()
    text: str
    index: int = _count()


@dataclass(frozen=True, kw_only=True)
class Result(Message):
    TYPE = "result"
    request_id: str = _id()
    token_ids: list[int] = _token_ids()
    text: str
    finish_reason: str = wire_field(choices=FINISH_REASONS)
    usage: Usage
    timings: Timings


@dataclass(frozen=True, kw_only=True)
class Error(Message):
    TYPE = "error"
    request_id: str = wire_field(max_len=MAX_ID_LEN)  # "" when the error concerns no request
    code: str = wire_field(choices=ERROR_CODES)
    message: str = wire_field(max_len=MAX_MESSAGE_LEN)
    retry_after: float | None = wire_field(None, ge=0)


# --- router <-> workers, and the KV data plane ---------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class WorkerHello(Message):
    TYPE = "worker_hello"
    worker_id: str = _id()
    role: str = wire_field(choices=ROLES)
    model_fingerprint: str = wire_field(min_len=1, max_len=256)
    num_blocks: int = _count()
    layout: KVLayout
    max_model_len: int = wire_field(ge=1)
    vocab_size: int = wire_field(ge=1)
    transports: list[str] = wire_field(min_len=1, max_len=16)
    kv_address: str = wire_field("", max_len=256)
    kv_descriptor: bytes = wire_field(b"", max_len=4096)
    node_id: str = wire_field("", max_len=MAX_ID_LEN)
    device_index: int = _count(0)


@dataclass(frozen=True, kw_only=True)
class Reserve(Message):
    TYPE = "reserve"
    request_id: str = _id()
    token_ids: list[int] = _token_ids(min_len=1)
    sampling: Sampling
    prefill_worker_id: str = _id()


@dataclass(frozen=True, kw_only=True)
class Reserved(Message):
    TYPE = "reserved"
    request_id: str = _id()
    block_ids: list[int] = wire_field(ge=0)


@dataclass(frozen=True, kw_only=True)
class PrefillTask(Message):
    TYPE = "prefill_task"
    request_id: str = _id()
    token_ids: list[int] = _token_ids(min_len=1)
    sampling: Sampling
    decode_worker_id: str = _id()
    decode_kv_address: str = wire_field(max_len=256)
    dst_block_ids: list[int] = wire_field(ge=0)
    transport: str = wire_field("host", min_len=1, max_len=32)
    decode_kv_descriptor: bytes = wire_field(b"", max_len=4096)


@dataclass(frozen=True, kw_only=True)
class GenerateTask(Message):
    TYPE = "generate_task"
    request_id: str = _id()
    token_ids: list[int] = _token_ids(min_len=1)
    sampling: Sampling


@dataclass(frozen=True, kw_only=True)
class KVHandoff(Message):
    TYPE = "kv_handoff"
    request_id: str = _id()
    src_worker_id: str = _id()
    first_token: int = wire_field(ge=0, le=MAX_TOKEN_ID)
    num_tokens: int = wire_field(ge=1)
    transport: str = wire_field(min_len=1, max_len=32)
    layout: KVLayout
    dst_block_ids: list[int] = wire_field(ge=0)
    reply_to: str = wire_field(max_len=256)
    cached_tokens: int = _count(0)


@dataclass(frozen=True, kw_only=True)
class HandoffAck(Message):
    TYPE = "handoff_ack"
    request_id: str = _id()
    ok: bool
    message: str = wire_field("", max_len=MAX_MESSAGE_LEN)


@dataclass(frozen=True, kw_only=True)
class TokenBatch(Message):
    TYPE = "token_batch"
    updates: list[TokenUpdate] = wire_field()


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message, WorkerLoad):
    TYPE = "heartbeat"
    worker_id: str = _id()


@dataclass(frozen=True, kw_only=True)
class AbortRequest(Message):
    TYPE = "abort_request"
    request_id: str = _id()


@dataclass(frozen=True, kw_only=True)
class Shutdown(Message):
    TYPE = "shutdown"
    reason: str = wire_field("", max_len=MAX_MESSAGE_LEN)


# What each socket accepts, for `decode(frame, expect=...)`.
CLIENT_TO_ROUTER = (Submit, Abort, Ping, Pong, StatsRequest, ScaleRequest)
ROUTER_TO_CLIENT = (Delta, Result, Error, Ping, Pong, Stats, ScaleReply)
WORKER_TO_ROUTER = (WorkerHello, Reserved, TokenBatch, Heartbeat, HandoffAck, Error, Ping, Pong)
ROUTER_TO_WORKER = (Reserve, PrefillTask, GenerateTask, AbortRequest, Shutdown, Ping, Pong)
DATA_PLANE = (KVHandoff, HandoffAck)


# --- encode / decode -----------------------------------------------------------------------------


def encode(msg: Message) -> bytes:
    """One frame for `msg`. Fields equal to their default are omitted."""
    if not isinstance(msg, Message):
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    body = {"v": PROTOCOL_VERSION, "type": msg.TYPE}
    body.update(_to_wire(msg))
    request_id = getattr(msg, "request_id", "")
    try:
        frame = msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # a field mutated after construction
        raise ProtocolError(INTERNAL, f"cannot encode {msg.TYPE}: {exc}", request_id) from exc
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(
            TOO_LARGE, f"{msg.TYPE} frame is {len(frame)} bytes, more than the limit of {MAX_FRAME_BYTES}",
            request_id,
        )
    return frame


def decode(frame: bytes, expect: tuple[type[Message], ...] | None = None) -> Message:
    """The validated message in `frame`; raises ProtocolError (only) for anything else.

    `expect` lists the message types this socket accepts; another known type is `unknown_type`.
    """
    try:
        return _decode(frame, expect)
    except ProtocolError as exc:
        if exc.request_id:
            raise
        raise ProtocolError(exc.code, exc.message, _recover_request_id(frame)) from None
    except Exception as exc:  # a bug here must still reach the caller as something it can answer
        raise ProtocolError(INTERNAL, f"decoder failed: {type(exc).__name__}", _recover_request_id(frame)) from exc


def _decode(frame: bytes, expect: tuple[type[Message], ...] | None) -> Message:
    record = _unpack(frame)
    if type(record) is not dict:
        raise ProtocolError(BAD_REQUEST, f"a frame must be a msgpack map, got {_show(record)}")
    version = record.get("v", MISSING)
    if version is MISSING:
        raise ProtocolError(UNSUPPORTED_VERSION, f"missing protocol version 'v'; this peer speaks v{PROTOCOL_VERSION}")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(
            UNSUPPORTED_VERSION, f"unsupported protocol version {_show(version)}; this peer speaks v{PROTOCOL_VERSION}"
        )
    name = record.get("type")
    if type(name) is not str:
        raise _bad("type", f"expected a message type name, got {_show(name)}")
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ProtocolError(UNKNOWN_TYPE, f"unknown message type {_show(name)}")
    if expect is not None and cls not in expect:
        accepted = ", ".join(c.TYPE for c in expect)
        raise ProtocolError(UNKNOWN_TYPE, f"message type {name!r} is not accepted here (expected: {accepted})")
    return _build(cls, {k: v for k, v in record.items() if k != "v" and k != "type"})


class _ContainerBudget:
    """msgpack hook counting maps and arrays, so nested empties cannot multiply memory."""

    def __init__(self) -> None:
        self.left = MAX_CONTAINERS

    def __call__(self, container: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise ProtocolError(TOO_LARGE, f"frame holds more than {MAX_CONTAINERS} maps and arrays")
        return container


def _unpack(frame: bytes) -> Any:
    try:
        view = memoryview(frame)
    except TypeError:
        raise ProtocolError(BAD_REQUEST, f"a frame must be bytes, got {type(frame).__name__}") from None
    size = view.nbytes
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(TOO_LARGE, f"frame is {size} bytes, more than the limit of {MAX_FRAME_BYTES}")
    budget = _ContainerBudget()
    try:
        # Declared lengths are capped by the frame's own size: a short frame cannot ask for a big allocation.
        return msgpack.unpackb(
            view, raw=False, strict_map_key=True, use_list=True,
            max_str_len=size, max_bin_len=size, max_ext_len=size,
            max_array_len=min(size, MAX_LIST_LEN), max_map_len=min(size // 2, MAX_MAP_LEN),
            list_hook=budget, object_hook=budget,
        )
    except ProtocolError:
        raise
    except UnicodeDecodeError:
        raise ProtocolError(BAD_REQUEST, "invalid UTF-8 in a string") from None
    except ValueError as exc:
        if "exceeds max_" in str(exc):  # msgpack's wording for its length limits
            raise ProtocolError(TOO_LARGE, f"frame: {exc}") from None
        raise ProtocolError(BAD_REQUEST, f"invalid msgpack ({str(exc) or type(exc).__name__})") from None
    except Exception as exc:
        raise ProtocolError(BAD_REQUEST, f"invalid msgpack ({type(exc).__name__})") from None


def _recover_request_id(frame: bytes) -> str:
    """Best effort: the top-level request_id of a frame that failed, so the error can be addressed.

    Walks the top-level map without building the other values, so it works on frames that are
    too large or broken further on. Returns "" unless it finds a valid request id.
    """
    try:
        view = memoryview(frame)[:MAX_FRAME_BYTES]
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(view.nbytes, 1))
        unpacker.feed(view)
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "request_id":
                value = unpacker.unpack()
                return value if type(value) is str and 0 < len(value) <= MAX_ID_LEN else ""
            unpacker.skip()
    except Exception:
        pass
    return ""


__all__ = [
    "PROTOCOL_VERSION", "DEFAULT_ROUTER_ADDRESS",
    "MAX_FRAME_BYTES", "MAX_LIST_LEN", "MAX_STR_LEN", "MAX_MAP_LEN", "MAX_CONTAINERS", "MAX_ID_LEN",
    "MAX_MESSAGE_LEN", "MAX_TOKEN_ID", "MAX_SCALE_DELTA",
    "BAD_REQUEST", "UNSUPPORTED_VERSION", "UNKNOWN_TYPE", "TOO_LARGE", "NOT_FOUND", "OVERLOADED",
    "UNAVAILABLE", "TIMEOUT", "ABORTED", "UNAUTHORIZED", "INTERNAL", "ERROR_CODES",
    "ROLES", "FINISH_REASONS",
    "ProtocolError", "Record", "Message", "REGISTRY", "wire_field", "encode", "decode",
    "Sampling", "Usage", "Timings", "WorkerLoad", "WorkerStats", "KVLayout", "TokenUpdate",
    "Submit", "Abort", "Ping", "Pong", "StatsRequest", "Stats", "ScaleRequest", "ScaleReply", "Delta", "Result", "Error",
    "WorkerHello", "Reserve", "Reserved", "PrefillTask", "GenerateTask", "KVHandoff", "HandoffAck", "TokenBatch",
    "Heartbeat", "AbortRequest", "Shutdown",
    "CLIENT_TO_ROUTER", "ROUTER_TO_CLIENT", "WORKER_TO_ROUTER", "ROUTER_TO_WORKER", "DATA_PLANE",
]
