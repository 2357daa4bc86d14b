"""Test-only fault injection for workers. Off unless $PDCLUSTER_FAULT_DIR is set when `serve` starts.

A worker reads the variable once, at start. With it set, a test *arms* a fault by writing a file of
that name into the folder; the file may hold a token id, and then the fault only hits a request
whose prompt starts with that token. The first worker to claim the file (an atomic rename to
`<name>.fired-<worker id>`) fires the fault, once. Faults:

| name | where | what happens |
| --- | --- | --- |
| `crash_prefill` | prefill worker, on a `prefill_task` | the worker SIGKILLs itself |
| `crash_decode` | decode or colocated worker, at a step that gave the request a token | the worker SIGKILLs itself |
| `kv_send_error` | prefill worker, on a KV handoff | the transport raises |
| `kv_drop` | prefill worker, on a KV handoff | the handoff is never sent (as if lost) |
| `kv_corrupt` | prefill worker, on a KV handoff | the payload is cut short |

docs/reliability.md lists the faults the tests try and what the cluster does about each.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

ENV = "PDCLUSTER_FAULT_DIR"
NAMES = ("crash_prefill", "crash_decode", "kv_send_error", "kv_drop", "kv_corrupt")


@dataclass(frozen=True)
class Faults:
    folder: str | None = None  # None: fault injection is off and nothing is ever checked

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get(ENV) or None)

    def claim(self, name: str, prompts: Iterable[list[int]], worker_id: str) -> bool:
        """True (once per arming, cluster-wide) when fault `name` is armed for one of these prompts."""
        if self.folder is None:
            return False
        assert name in NAMES, name
        path = os.path.join(self.folder, name)
        try:
            with open(path) as f:
                marker = f.read().strip()
        except OSError:
            return False
        if not any(prompt and (not marker or str(prompt[0]) == marker) for prompt in prompts):
            return False
        try:
            os.rename(path, f"{path}.fired-{worker_id}")
        except OSError:
            return False  # another worker claimed it first
        return True


def crash() -> None:
    """Die as a segfault or the OOM killer would: no cleanup, no goodbye."""
    os.kill(os.getpid(), signal.SIGKILL)
