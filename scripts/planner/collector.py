"""The cyclic garbage collector, paused while a simulation runs.

A simulation holds many long-lived lists (every prompt's token ids, each engine's sequences and block tables) and
makes few reference cycles: each collection its allocations would trigger scans those lists again, for nothing.
Its garbage is freed by reference counting as it runs; what cycles it leaves go at the first collection after it.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
