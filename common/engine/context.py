"""The forward context: the one piece of global state, set around each forward so layers keep `forward(x)`."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from common.engine.attention.metadata import AttentionMetadata

_metadata: AttentionMetadata | None = None


def get_attn_metadata() -> AttentionMetadata | None:
    return _metadata


@contextmanager
def forward_context(metadata: AttentionMetadata | None) -> Iterator[None]:
    global _metadata
    _metadata = metadata
    try:
        yield
    finally:
        _metadata = None
