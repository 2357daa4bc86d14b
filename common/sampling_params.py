from __future__ import annotations

import math
from dataclasses import dataclass, field


class InvalidRequest(ValueError):
    """A request the engine refuses; `field` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0): no top-k
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x: object) -> bool:
            return (is_int(x) or isinstance(x, float)) and math.isfinite(x)

        if not is_int(self.max_tokens) or self.max_tokens <= 0:
            raise InvalidRequest("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not is_num(self.temperature) or self.temperature < 0:
            raise InvalidRequest("temperature", f"must be a finite number >= 0, got {self.temperature!r}")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise InvalidRequest("top_k", f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise InvalidRequest("seed", f"must be an integer in [0, 2**63), got {self.seed!r}")
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequest("stop_token_ids", "must be a list of non-negative integers")
        if not isinstance(self.ignore_eos, bool):
            raise InvalidRequest("ignore_eos", f"must be a boolean, got {self.ignore_eos!r}")
        self.temperature = float(self.temperature)
        self.top_p = float(self.top_p)
        self.stop_token_ids = list(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
