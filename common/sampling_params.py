"""How a request samples: one record for the engine and the wire (the `Sampling` record of docs/protocol.md)."""
from __future__ import annotations

import math

import msgspec


class InvalidRequest(ValueError):
    """A request, or a record, refused for its content; `field` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.problem = message

    def __reduce__(self):  # Ray and copy rebuild exceptions from their arguments
        return type(self), (self.field, self.problem)


_INT_LIMIT = 2**63  # what msgpack carries as a signed integer


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and -_INT_LIMIT <= x < _INT_LIMIT


def _is_num(x: object) -> bool:
    return (_is_int(x) or isinstance(x, float)) and math.isfinite(x)


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Checked when made and when decoded from the wire, with the same messages (InvalidRequest names the field)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k
    seed: int | None = None
    stop_token_ids: list[int] = []
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens <= 0:
            raise InvalidRequest("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not _is_num(self.temperature) or self.temperature < 0:
            raise InvalidRequest("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if not _is_num(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequest("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise InvalidRequest("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        stops = self.stop_token_ids
        if not isinstance(stops, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in stops):
            raise InvalidRequest("stop_token_ids", "must be a list of non-negative integers")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequest("ignore_eos", f"must be a boolean, got {self.ignore_eos!r}")
        # One form whatever was given: floats, and a list (a tuple would compare unequal).
        for name, value in (("temperature", float(self.temperature)), ("top_p", float(self.top_p)),
                            ("stop_token_ids", list(stops))):
            msgspec.structs.force_setattr(self, name, value)

    def validate(self) -> None:
        """Made and decoded records are checked already; kept for callers that check a record they were handed."""
        self.__post_init__()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return cls.__struct_fields__
