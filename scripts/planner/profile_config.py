"""`pdcluster profile`'s settings: the engine's own (EngineConfig's fields, so the profiled engine is built as
`serve` builds it) and the profiler's. Tensor-free: the command line imports it to make its flags."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from common.config import ConfigError, EngineConfig, _opt

# EngineConfig's fields the profile command sets itself (the prefix cache is on: the cached-prefix points
# need it), or that say nothing about speed
NOT_FLAGS = ("tensor_parallel_size", "seed", "enable_prefix_caching")


@dataclass
class ProfileConfig(EngineConfig):
    """The engine flags of `serve` (less NOT_FLAGS) and the profiler's own."""

    out: str = _opt("", "where to write the profile JSON (required)")
    tp: int = _opt(1, "tensor-parallel size: GPUs one engine spans (needs as many visible GPUs)")
    quick: bool = _opt(False, "fewer points (4 prompt sizes x 2 prefixes, 4 batches x 2 contexts, 3 handoff "
                                     "sizes): quicker, a looser fit")
    model_name: str = _opt("", "the model's name in the profile (default: config.json's _name_or_path, else the "
                               "--model folder's name)")

    def __post_init__(self) -> None:
        if not self.out:
            raise ConfigError("profile: --out FILE is required")
        if not Path(self.out).resolve().parent.is_dir():  # found out now, not after minutes of measuring
            raise ConfigError(f"--out: no folder {str(Path(self.out).parent)!r} to write the profile in")
        if self.tp < 1:
            raise ConfigError(f"--tp: must be >= 1, got {self.tp}")
        if self.tp > 1 and self.device == "cpu":
            raise ConfigError(f"--tp {self.tp}: needs {self.tp} visible GPUs; --device cpu profiles one engine "
                              "on the CPU")
        self.tensor_parallel_size = self.tp
        super().__post_init__()

    def engine_config(self) -> EngineConfig:
        """The engine's settings alone, as `serve` would pass them to a worker."""
        names = [f.name for f in dataclasses.fields(EngineConfig) if f.init]
        return EngineConfig(**{name: getattr(self, name) for name in names})
