"""Stop 24 (CPU): how long a KV link's thread waits for the GIL while a worker's main thread is busy in Python.

The main thread either spins as the engine does while a step runs (InFlight.tokens calling the worker's `_meanwhile`:
a zmq poll(0) and a little Python, over and over), or sleeps (the loop idle). The link thread polls as
kvtransfer/nccl/link.py's `wait` does: sleep 20 us, check, again; each sleep's overrun is how late it got the GIL
back. Also the main thread's spin count, for what a shorter switch interval costs it."""
import statistics
import sys
import threading
import time

import zmq


def link_thread(samples: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(20e-6)
        samples.append(time.perf_counter() - t)


def spin(seconds: float) -> int:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PULL)
    sock.bind("inproc://probe")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        poller.poll(0)
        sum(range(100))  # a tick's worth of Python
        n += 1
    sock.close()
    return n


def python_work(seconds: float) -> int:
    """Launch-like work: Python that holds the GIL throughout."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(1000))
        n += 1
    return n


def run(main: str, interval: float, seconds: float = 2.0) -> None:
    sys.setswitchinterval(interval)
    samples: list[float] = []
    stop = threading.Event()
    th = threading.Thread(target=link_thread, args=(samples, stop))
    th.start()
    if main == "sleep":
        time.sleep(seconds)
        n = 0
    elif main == "spin":
        n = spin(seconds)
    else:
        n = python_work(seconds)
    stop.set()
    th.join()
    q = statistics.quantiles([s * 1e6 for s in samples], n=100)
    print(f"main {main:6s} switch interval {interval * 1e3:5.2f} ms: link polls {len(samples):7d}, sleep of 20 us took "
          f"p50 {q[49]:7.0f} us, p90 {q[89]:7.0f}, max {max(samples) * 1e6:7.0f}; main's loops {n}", flush=True)


if __name__ == "__main__":
    for main in ("sleep", "spin", "python"):
        for interval in (0.005, 0.0005, 0.0002):
            run(main, interval)
    print("main alone (no link thread), python, 5 ms:", python_work(2.0), "; 0.5 ms:", (sys.setswitchinterval(0.0005), python_work(2.0))[1])
