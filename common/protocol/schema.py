"""The grammar every wire record is written in: msgspec structs with constraints, and the limits behind them.

A record is a frozen struct that refuses unknown fields and omits fields at their default when encoded. Field
constraints (types, ranges, lengths) are checked when a frame is decoded; rules across fields (`_check`) also
when a record is made, and raise InvalidRequest naming the field.
"""
from __future__ import annotations

import sys
from typing import Annotated, ClassVar, Literal, get_args

import msgspec
from msgspec import UNSET, Meta, UnsetType

PROTOCOL_VERSION = 1

# Limits. Exceeding a length limit is `too_large`; every other broken constraint is `bad_request`.
MAX_FRAME_BYTES = 8 * 1024 * 1024
MAX_LIST_LEN = 1_000_000  # items in any array (e.g. token ids)
MAX_STR_LEN = 4 * 1024 * 1024  # code points in any string without a tighter limit
MAX_ID_LEN = 128  # request and worker ids
MAX_MESSAGE_LEN = 4096  # human-readable error text
MAX_ADDRESS_LEN = 256
MAX_TOKEN_ID = 2**31 - 1
MAX_SCALE_DELTA = 64  # workers one scale_request may add or remove

Role = Literal["prefill", "decode", "colocated"]
FinishReason = Literal["stop", "length", "abort"]
ROLES: tuple[str, ...] = get_args(Role)
FINISH_REASONS: tuple[str, ...] = get_args(FinishReason)

_FINITE = sys.float_info.max  # a bound on both sides rejects NaN and the infinities

Id = Annotated[str, Meta(min_length=1, max_length=MAX_ID_LEN)]
OptionalId = Annotated[str, Meta(max_length=MAX_ID_LEN)]  # "" when there is none
Text = Annotated[str, Meta(max_length=MAX_STR_LEN)]
Message_ = Annotated[str, Meta(max_length=MAX_MESSAGE_LEN)]
Address = Annotated[str, Meta(max_length=MAX_ADDRESS_LEN)]
Count = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0, le=_FINITE)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
TokenIds = Annotated[list[TokenId], Meta(max_length=MAX_LIST_LEN)]
Prompt = Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_LIST_LEN)]
BlockIds = Annotated[list[Count], Meta(max_length=MAX_LIST_LEN)]


class Record(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every wire record. The lists a record holds are not copied: treat them as read-only."""

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """Rules across fields: raise InvalidRequest(field, problem)."""


class Message(Record, tag_field="type"):
    """A top-level record: `TYPE` is its `type` on the wire (its struct tag). `v` is the envelope's version, which
    the codec writes and checks: it is UNSET on every message a program holds."""

    TYPE: ClassVar[str]
    v: int | UnsetType = UNSET


REGISTRY: dict[str, type[Message]] = {}


def message(cls: type[Message]) -> type[Message]:
    """Class decorator: registers a message type under its tag."""
    name = cls.__struct_config__.tag
    if not isinstance(name, str) or name in REGISTRY:
        raise TypeError(f"{cls.__name__}: a message needs a tag of its own, got {name!r}")
    cls.TYPE = name
    REGISTRY[name] = cls
    return cls

