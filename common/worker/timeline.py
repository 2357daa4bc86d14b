"""A worker's timeline: when each request passed each point of its path through this worker, written as JSON lines
to `<folder>/<worker id>.jsonl` (`pdcluster serve --timeline-dir`). The times are `time.monotonic()`, one clock
for every process of a host, so the files of workers on one host line up (`scripts/timeline.py` joins them).

Events (each with `t`, `worker`, `role`, `request`, `event`):
- `received`: the request reached this worker, a prompt to prefill or a reservation (with `tokens`, its prompt's);
- `launched`: a step with some of its prompt, or with its first decode here, was launched (`t`: the step's start);
- `prefilled`: its first token collected;
- `kv_sent`: its KV handed to the transport, the record about to go out;
- `kv_record`: the handoff's record reached the decode worker;
- `landed`: the KV is in the reserved blocks and the first token is reported;
- `finished`.
Events of one request on two workers are in causal order: each is marked before the message that leads to the next.
A worker also marks each of its steps, with no request: `step` (`t`: when its batch was collected), with `step_us`
(since the step before ended), `gpu_us` (its batch's GPU time; 0 off CUDA) and `seqs` (the sequences given a token);
and the pauses of its own process that hold its loop, with `us` (`t`: when the pause ended), from PAUSE_S on:
`gc_pause`, a full collection of the garbage collector; `flush_pause`, this timeline's own write to its file.
A prefill worker's `kv_sent` has `send_us`, the transport's part of the handoff; of it, `wait_us` waiting for a direct
copy (cuda_ipc) and `copy_us` that copy's GPU time (0 for the other transports), and `cpu_us` the sending thread's CPU.
"""
from __future__ import annotations

import json
import os
import time

from common.stalls import GcPauses

FLUSH_EVERY = 512  # events held in memory before they are written (the worker also flushes at each heartbeat)
PAUSE_S = 0.005  # a shorter pause of the process is not marked


class Timeline:
    """Off (every call a no-op) unless given a folder."""

    def __init__(self, folder: str | None, worker_id: str, role: str, pause_s: float = PAUSE_S):
        self.worker_id, self.role, self.pause_s = worker_id, role, pause_s
        self.path = os.path.join(folder, f"{worker_id}.jsonl") if folder else None
        self._events: list[str] = []
        self._once: dict[str, set[str]] = {}  # request -> events `first` has marked
        self._gc: GcPauses | None = None
        if self.path:
            os.makedirs(folder, exist_ok=True)

    @property
    def on(self) -> bool:
        return self.path is not None

    def mark(self, request_id: str, event: str, t: float | None = None, **fields: int) -> None:
        if self.path is not None:
            self._write(time.monotonic() if t is None else t, {"request": request_id, "event": event, **fields})

    def step(self, seconds: float, gpu_seconds: float, seqs: int) -> None:
        if self.path is not None:
            self._write(time.monotonic(), {"event": "step", "step_us": round(seconds * 1e6),
                                           "gpu_us": round(gpu_seconds * 1e6), "seqs": seqs})

    def _write(self, t: float, fields: dict) -> None:
        self._events.append(json.dumps({"t": t, "worker": self.worker_id, "role": self.role, **fields}))
        if len(self._events) >= FLUSH_EVERY:
            self.flush()

    def first(self, request_id: str, event: str, t: float | None = None) -> None:
        """`mark`, the first time only for this request (until `forget`)."""
        if self.path is None:
            return
        seen = self._once.setdefault(request_id, set())
        if event not in seen:
            seen.add(event)
            self.mark(request_id, event, t)

    def forget(self, request_id: str) -> None:
        """The request has left this worker."""
        self._once.pop(request_id, None)

    def flush(self) -> None:
        if self.path is None or not self._events:
            return
        began = time.monotonic()
        with open(self.path, "a") as f:
            f.write("\n".join(self._events) + "\n")
        self._events.clear()
        self._pause("flush_pause", time.monotonic() - began)  # written with the next flush

    def watch_gc(self) -> None:
        """Mark the garbage collector's full collections (`gc_pause`) until `unwatch_gc`."""
        if self.path is not None and self._gc is None:
            self._gc = GcPauses(on_pause=lambda seconds: self._pause("gc_pause", seconds)).start()

    def unwatch_gc(self) -> None:
        if self._gc is not None:
            self._gc.stop()
            self._gc = None

    def _pause(self, event: str, seconds: float) -> None:
        """A pause of `seconds` that ended now, held, not written: a flush from here would pause again (or write from
        inside a collection)."""
        if seconds >= self.pause_s:
            self._events.append(json.dumps({"t": time.monotonic(), "worker": self.worker_id, "role": self.role,
                                            "event": event, "us": round(seconds * 1e6)}))
