"""Test-only fault injection for workers. Off unless $PDCLUSTER_FAULT_DIR is set when `serve` starts.

A worker reads the variable once, at start. With it set, a test *arms* a fault by writing a file of
that name into the folder; the file may hold a token id, and then the fault only hits a request
whose prompt starts with that token. The first worker to claim the file (an atomic rename to
`<name>.fired-<worker id>`) fires the fault, once. Faults:

| name | where | what happens |
| --- | --- | --- |
| `crash_prefill` | prefill worker, on a `prefill_task` | the worker SIGKILLs itself |
| `crash_decode` | decode or colocated worker, at a step that gave the request a token | the worker SIGKILLs itself |
| `slow_step` | any worker, at a step while it holds the request | it takes longer (below), as one long prefill would |
| `kv_send_error` | prefill worker, on a KV handoff | the transport raises |
| `kv_drop` | prefill worker, on a KV handoff | the handoff is never sent (as if lost) |
| `kv_corrupt` | prefill worker, on a KV handoff | the payload is cut short |

`slow_step`: the step takes the seconds the file names after the token id (`"401 9"`) longer.

docs/reliability.md lists the faults the tests try and what the cluster does about each.
"""
from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass

ENV = "PDCLUSTER_FAULT_DIR"
NAMES = ("crash_prefill", "crash_decode", "slow_step", "kv_send_error", "kv_drop", "kv_corrupt")


@dataclass(frozen=True)
class Faults:
    folder: str | None = None  # None: fault injection is off and nothing is ever checked

    @classmethod
    def from_env(cls) -> Faults:
        return cls(os.environ.get(ENV) or None)

    def claim(self, name: str, prompts: Iterable[list[int]], worker_id: str) -> bool:
        """True (once per arming, cluster-wide) when fault `name` is armed for one of these prompts."""
        return self._claim(name, prompts, worker_id) is not None

    def claim_seconds(self, name: str, prompts: Iterable[list[int]], worker_id: str) -> float:
        """Like `claim`, for a fault armed with a duration after its token id: that duration, else 0."""
        args = self._claim(name, prompts, worker_id)
        return float(args[0]) if args else 0.0

    def _claim(self, name: str, prompts: Iterable[list[int]], worker_id: str) -> list[str] | None:
        """The armed file's words after its token id, once claimed; None when not armed for these prompts."""
        if self.folder is None:
            return None
        assert name in NAMES, name
        path = os.path.join(self.folder, name)
        try:
            with open(path) as f:
                marker, *args = f.read().split() or [""]
        except OSError:
            return None
        if not any(prompt and (not marker or str(prompt[0]) == marker) for prompt in prompts):
            return None
        try:
            os.rename(path, f"{path}.fired-{worker_id}")
        except OSError:
            return None  # another worker claimed it first
        return args


def crash() -> None:
    """Die as a segfault or the OOM killer would: no cleanup, no goodbye."""
    os.kill(os.getpid(), signal.SIGKILL)
