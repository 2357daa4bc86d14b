"""Where the engine runs: the device an `auto` config means on this machine, the torch dtypes of dtype names, and
whether the GPU is shared through an MPS server."""
from __future__ import annotations

import functools
import os

import torch

from common.config import ConfigError, EngineConfig

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def place(config: EngineConfig) -> EngineConfig:
    """`config` with its device decided for this process (auto: cuda when torch sees a GPU), checked here rather
    than where the config was made: `serve` on a head node without a GPU still starts CUDA workers elsewhere."""
    config = config.on_device("cuda" if torch.cuda.is_available() else "cpu")
    if config.device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device: cuda asked for but torch sees no CUDA device")
        if config.tensor_parallel_size > torch.cuda.device_count():
            raise ConfigError(f"tensor_parallel_size: {config.tensor_parallel_size} ranks need as many GPUs, "
                              f"torch sees {torch.cuda.device_count()}")
    return config


def torch_dtype(config: EngineConfig) -> torch.dtype:
    return TORCH_DTYPES[config.dtype_name]


@functools.cache
def mps_client() -> bool:
    """This process is a client of an MPS server (`serve --mps` gives each worker its server's pipe): its kernels run
    beside another process's on the GPU."""
    return "CUDA_MPS_PIPE_DIRECTORY" in os.environ


@functools.cache
def mps_share() -> str | None:
    """The percent of the SMs this process may use as an MPS client (`serve --mps`), None if not capped; read once,
    as CUDA reads it at start-up."""
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    return None if share in (None, "100") else share
