"""Stop 37: how soon a worker's thread sees a running step's end, and how far a KV link thread gets meanwhile, for
the ways of waiting: spinning on event.query() between message polls (`spin`), the same with a 50 us sleep each turn
(`yield`, stop 35), and blocked in zmq_poll until common/worker/wakeup.py's thread sees the event (`block`). A link
thread stands beside it: Python sections of SECTION_US (making tensors, posting) between 20 us sleeps (polling).

Each mode runs STEPS steps of a STEP_MS kernel one after the other, the next launched once the last one's end is
seen: (wall time - GPU time) / step is what seeing the end cost; the link thread's turns a second, what it got."""
import ctypes
import os
import sys
import threading
import time

import torch
import zmq

sys.path.insert(0, os.getcwd())
from common.worker.wakeup import Wakeup  # noqa: E402

libc = ctypes.CDLL(None)
STEP_MS, STEPS = float(os.environ.get("STEP_MS", "3")), int(os.environ.get("STEPS", "300"))
sys.setswitchinterval(float(os.environ.get("SWITCH_S", "0.0005")))
libc.prctl(29, 1000, 0, 0, 0)
torch.cuda.set_device(0)
torch.cuda._sleep(1000)
torch.cuda.synchronize()
# cycles for STEP_MS: calibrate
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record(); torch.cuda._sleep(10_000_000); end.record(); end.synchronize()
cycles = int(10_000_000 * STEP_MS / start.elapsed_time(end))
poller, wakeup = zmq.Poller(), Wakeup()
poller.register(wakeup.fileno(), zmq.POLLIN)
ctx = zmq.Context(); inbox = ctx.socket(zmq.PULL); inbox.bind("inproc://inbox"); poller.register(inbox, zmq.POLLIN)


def run(mode: str, section_s: float) -> str:
    stop, turns = threading.Event(), [0]

    def link() -> None:
        libc.prctl(29, 1000, 0, 0, 0)
        torch.cuda.set_device(0)
        side = torch.cuda.Stream()
        while not stop.is_set():
            t = time.perf_counter()
            with torch.cuda.stream(side):
                while time.perf_counter() - t < section_s:
                    torch.empty(4, device="cuda")
            turns[0] += 1
            time.sleep(20e-6)

    thread = threading.Thread(target=link, daemon=True)
    if section_s >= 0:
        thread.start()
    gpu_ms, t0 = 0.0, time.perf_counter()
    for _ in range(STEPS):
        begin, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record(); torch.cuda._sleep(cycles); done.record()
        while not done.query():
            if mode == "block":
                wakeup.watch(done)
                for sock, _ in poller.poll(20):
                    if sock == wakeup.fileno():
                        wakeup.clear()
            else:
                poller.poll(0)
                if mode == "yield":
                    time.sleep(50e-6)
        gpu_ms += begin.elapsed_time(done)
    wall = time.perf_counter() - t0
    stop.set()
    if section_s >= 0:
        thread.join()
    over = (wall * 1e3 - gpu_ms) / STEPS * 1e3
    return (f"{mode:5s} link section {section_s * 1e6:4.0f} us: each step's end seen {over:6.0f} us after (mean), "
            f"link turns {turns[0] / wall:7.0f}/s")


print(torch.cuda.get_device_name(), f"step {STEP_MS} ms x {STEPS}, switch interval {sys.getswitchinterval() * 1e3} ms")
for section in (-1, 0, 100e-6, 300e-6):
    for mode in ("spin", "yield", "block"):
        print(run(mode, section), flush=True)
