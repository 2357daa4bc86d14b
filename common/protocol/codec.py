"""Frames in and out: `encode` writes a message as one msgpack map `{"v": 1, "type": ..., fields}`; `decode` turns
untrusted bytes into a validated message or raises ProtocolError, and nothing else.

The happy path is one msgspec decode against the union of every message type. Only a frame that fails is looked
at again, to say why in the protocol's terms: a bad envelope (version, type) before a bad field.
"""
from __future__ import annotations

import functools
import re
import typing
from typing import Any, Union

import msgpack
import msgspec

from common.protocol.errors import (
    BAD_REQUEST, INTERNAL, TOO_LARGE, UNKNOWN_TYPE, UNSUPPORTED_VERSION, ProtocolError,
)
from common.protocol.schema import MAX_FRAME_BYTES, MAX_ID_LEN, MAX_MESSAGE_LEN, PROTOCOL_VERSION, REGISTRY, Message

_VERSION_ENTRY = msgspec.msgpack.encode("v") + msgspec.msgpack.encode(PROTOCOL_VERSION)
_encoder = msgspec.msgpack.Encoder()
_decoder: msgspec.msgpack.Decoder | None = None  # built by `prepare`, once every message type is defined


def encode(msg: Message) -> bytes:
    """One frame for `msg`: the version first, then its type and the fields not at their default."""
    if not isinstance(msg, Message):
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    try:
        body = _encoder.encode(msg)
    except (TypeError, ValueError, OverflowError) as exc:  # a field mutated into something unencodable
        raise ProtocolError(INTERNAL, f"cannot encode {msg.TYPE}: {exc}", getattr(msg, "request_id", "")) from exc
    frame = _with_version(body)
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(TOO_LARGE, f"{msg.TYPE} frame is {len(frame)} bytes, more than the limit of "
                                       f"{MAX_FRAME_BYTES}", getattr(msg, "request_id", ""))
    return frame


def _with_version(body: bytes) -> bytes:
    """`body` (a msgpack map whose first key is "type") with the "v" entry in front of its entries."""
    head = body[0]
    if head & 0xF0 == 0x80:  # fixmap
        count, entries = head & 0x0F, memoryview(body)[1:]
    else:  # map16: a message has fewer than 65536 fields
        count, entries = int.from_bytes(body[1:3], "big"), memoryview(body)[3:]
    count += 1
    header = bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")
    return b"".join((header, _VERSION_ENTRY, entries))


def decode(frame: bytes | bytearray | memoryview, expect: tuple[type[Message], ...] | None = None) -> Message:
    """The validated message in `frame`; raises ProtocolError (only) for anything else.

    `expect` lists the message types this socket accepts; another known type is `unknown_type`.
    """
    try:
        view = memoryview(frame)
    except TypeError:
        raise ProtocolError(BAD_REQUEST, f"a frame must be bytes, got {type(frame).__name__}") from None
    if view.nbytes > MAX_FRAME_BYTES:
        raise ProtocolError(TOO_LARGE, f"frame is {view.nbytes} bytes, more than the limit of {MAX_FRAME_BYTES}",
                            _peek(view).get("request_id", ""))
    try:
        msg = _messages().decode(view)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise _explain(view, exc, expect) from None
    except Exception as exc:  # a bug here must still reach the caller as something it can answer
        raise ProtocolError(INTERNAL, f"decoder failed: {type(exc).__name__}", _peek(view).get("request_id", "")) \
            from exc
    if msg.v != PROTOCOL_VERSION:
        raise _version_error(msg.v, getattr(msg, "request_id", ""))
    if expect is not None and type(msg) not in expect:
        raise _not_accepted(msg.TYPE, expect, getattr(msg, "request_id", ""))
    msgspec.structs.force_setattr(msg, "v", msgspec.UNSET)  # a decoded message equals the one that was sent
    return msg


def checked(msg: Message) -> Message:
    """`msg` as its receiver will see it: every field checked as when decoded (making a record checks only the
    rules across its fields). Raises ProtocolError naming the field. For a sender that takes user input."""
    return decode(encode(msg), expect=(type(msg),))


def prepare() -> None:
    """Builds the decoder over every message type defined so far (common/protocol/__init__.py calls it once they all
    are). Building it takes milliseconds: left to a process's first frame, it was the first request's to pay, on
    each worker and client."""
    global _decoder
    _decoder = msgspec.msgpack.Decoder(Union[tuple(REGISTRY.values())])  # type: ignore[arg-type]


def _messages() -> msgspec.msgpack.Decoder:
    if _decoder is None:
        prepare()
    return _decoder


def _version_error(version: object, request_id: str) -> ProtocolError:
    if version is msgspec.UNSET or version is _MISSING:
        return ProtocolError(UNSUPPORTED_VERSION, f"missing protocol version 'v'; this peer speaks "
                                                  f"v{PROTOCOL_VERSION}", request_id)
    return ProtocolError(UNSUPPORTED_VERSION, f"unsupported protocol version {_show(version)}; this peer speaks "
                                              f"v{PROTOCOL_VERSION}", request_id)


def _not_accepted(name: str, expect: tuple[type[Message], ...], request_id: str) -> ProtocolError:
    accepted = ", ".join(c.TYPE for c in expect)
    return ProtocolError(UNKNOWN_TYPE, f"message type {name!r} is not accepted here (expected: {accepted})",
                         request_id)


# ---- why a frame failed ---------------------------------------------------------------------------------------

_MISSING = object()
_AT = re.compile(r"^(?P<body>.*?)(?: - at `(?:key` in `)?\$(?P<path>[^`]*)`)?$", re.S)
_MSGPACK_NAMES = {"object": "a map", "array": "an array", "None": "nil", "null": "nil", "str": "a string",
                  "bytes": "binary", "bool": "a boolean", "int": "an integer", "float": "a number",
                  "ext": "an extension type"}
_OURS = re.compile(r"^[A-Za-z_][\w.\[\]]*: ")  # a record's own check: "field: problem"


def _explain(view: memoryview, exc: Exception, expect: tuple[type[Message], ...] | None) -> ProtocolError:
    head = _peek(view)
    request_id = head.get("request_id", "")
    if isinstance(exc, UnicodeDecodeError):
        return ProtocolError(BAD_REQUEST, "invalid UTF-8 in a string", request_id)
    if isinstance(exc, RecursionError):
        return ProtocolError(BAD_REQUEST, "frame nested too deeply", request_id)
    if isinstance(exc, msgspec.DecodeError) and not isinstance(exc, msgspec.ValidationError):
        return ProtocolError(BAD_REQUEST, f"invalid msgpack ({exc})", request_id)
    if not head.get("map", False):
        return ProtocolError(BAD_REQUEST, "a frame must be a msgpack map", request_id)
    if head.get("bad_key", False):  # a map whose keys are not all strings is malformed, whatever else it holds
        return ProtocolError(BAD_REQUEST, field_problem(str(exc))[1], request_id)
    version = head.get("v", _MISSING)
    if type(version) is not int or version != PROTOCOL_VERSION:
        return _version_error(version, request_id)
    name = head.get("type", _MISSING)
    if type(name) is not str:
        return ProtocolError(BAD_REQUEST, f"type: expected a message type name, got {_show(name)}", request_id)
    cls = REGISTRY.get(name)
    if cls is None:
        return ProtocolError(UNKNOWN_TYPE, f"unknown message type {_show(name)}", request_id)
    if expect is not None and cls not in expect:
        return _not_accepted(name, expect, request_id)
    code, message = field_problem(str(exc))
    return ProtocolError(code, message[:MAX_MESSAGE_LEN], request_id)


def field_problem(text: str) -> tuple[str, str]:
    """(code, "path: problem") from a msgspec validation message, e.g. "Expected `int` >= 0 - at `$.ids[1]`"
    -> (bad_request, "ids[1]: expected `int` >= 0"). Over a length limit is too_large."""
    m = _AT.match(text)
    body, path = m.group("body"), (m.group("path") or "").lstrip(".")
    code = TOO_LARGE if "of length <=" in body else BAD_REQUEST
    if body.startswith("Object contains unknown field `"):
        field = body.split("`")[1][:64]
        return code, f"{_join(path, field)}: unknown field"
    if body.startswith("Object missing required field `"):
        field = body.split("`")[1]
        return code, f"{_join(path, field)}: missing required field"
    if _OURS.match(body):  # "field: problem" from a record's own check (nested: prefixed by where it is)
        return code, _join(path, body)
    if body.startswith("Invalid enum value") or body.startswith("Invalid value"):
        choices = _choices().get(re.sub(r"\[\d+\]$", "", path.rsplit(".", 1)[-1]))
        body = f"must be one of {', '.join(choices)}; got " + body.split("value ", 1)[1] if choices else body
    where = f"{path or 'frame'} key" if "at `key` in" in text else path or "frame"
    body = re.sub(r"`([^`]+)`", lambda m: " or ".join(_MSGPACK_NAMES.get(t.strip(), t.strip())
                                                     for t in m.group(1).split("|")), body)
    return code, f"{where}: {body[:1].lower()}{body[1:]}"


@functools.cache
def _choices() -> dict[str, tuple[str, ...]]:
    """Field name -> the values its Literal type allows, across every message and record (for error text)."""
    found: dict[str, tuple[str, ...]] = {}
    seen: set[type] = set()

    def walk(cls: type) -> None:
        if cls in seen:
            return
        seen.add(cls)
        for name, hint in typing.get_type_hints(cls).items():
            for tp in _leaves(hint):
                if typing.get_origin(tp) is typing.Literal:
                    found[name] = typing.get_args(tp)
                elif isinstance(tp, type) and issubclass(tp, msgspec.Struct):
                    walk(tp)

    for cls in REGISTRY.values():
        walk(cls)
    return found


def _leaves(hint: Any) -> list[Any]:
    """The types inside a hint: through unions, lists and Annotated."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Literal or not args:
        return [hint]
    return [leaf for arg in args for leaf in _leaves(arg)]


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _show(value: object, width: int = 40) -> str:
    """A short, safe description of an untrusted value (never the repr of a whole structure)."""
    if value is None:
        return "nil"
    if value is _MISSING:
        return "nothing"
    if isinstance(value, (str, bytes)):
        return repr(value[:width]) + ("..." if len(value) > width else "")
    if isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, list):
        return f"an array of {len(value)} items"
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    return f"a {type(value).__name__}"


def _peek(view: memoryview) -> dict[str, Any]:
    """Best effort, for error replies: whether the frame is a map, and its top-level "v", "type" and (valid)
    "request_id", read without building the other values, so it works on frames broken further on."""
    seen: dict[str, Any] = {"map": False}
    try:
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=max(view.nbytes, 1))
        unpacker.feed(view)
        entries = unpacker.read_map_header()
        seen["map"] = True
        for _ in range(entries):
            key = unpacker.unpack()
            if type(key) is not str:
                seen["bad_key"] = True
            elif key in ("v", "type", "request_id") and key not in seen:
                seen[key] = unpacker.unpack()
            else:
                unpacker.skip()
    except Exception:
        pass
    rid = seen.pop("request_id", "")
    if type(rid) is str and 0 < len(rid) <= MAX_ID_LEN:
        seen["request_id"] = rid
    return seen
