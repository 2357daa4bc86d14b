"""Stop 22, issue 21: the CPU each thread of the serve process (the router, with its Ray driver), of the bench
process and of the Ray worker processes (the engines: `ray::...`) uses, sampled from /proc every INTERVAL seconds while a bench runs; prints each half-second window where some
thread used more than a third of a core, with that window's busiest threads. Started beside `pdcluster bench`; ends
when the bench process does.

    python docs/gpu_runs/stop22_cpu_sampler.py BENCH_PID OUT.txt
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict

INTERVAL = 0.1
WINDOW = 5  # samples a window
TICK = os.sysconf("SC_CLK_TCK")


def threads(pid: int) -> dict[str, float]:
    """'<process>/<thread name>:<tid>' -> CPU seconds so far."""
    out = {}
    try:
        comm = open(f"/proc/{pid}/comm").read().strip()
        for tid in os.listdir(f"/proc/{pid}/task"):
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            out[f"{comm}:{pid}/{name}:{tid}"] = (int(fields[11]) + int(fields[12])) / TICK
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return out


def watched(bench: int) -> list[int]:
    """The bench process, its `serve` child (whose main thread runs the router) and Ray's worker processes."""
    pids = [bench]
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = open(f"/proc/{pid}/stat").read()
                if stat[stat.index("(") + 1:].startswith("ray::"):
                    pids.append(int(pid))
                elif stat.rsplit(")", 1)[1].split()[1] == str(bench) and "serve" in open(f"/proc/{pid}/cmdline").read():
                    pids.append(int(pid))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    return pids


def main() -> None:
    bench, out = int(sys.argv[1]), open(sys.argv[2], "w")
    start = time.monotonic()
    last: dict[str, float] = {}
    window: dict[str, float] = defaultdict(float)
    n = 0
    while os.path.exists(f"/proc/{bench}"):
        now = {}
        for pid in watched(bench):
            now.update(threads(pid))
        for key, cpu in now.items():
            if key in last:
                window[key] += cpu - last[key]
        last = now
        n += 1
        if n % WINDOW == 0:
            span = WINDOW * INTERVAL
            busy = sorted(((cpu / span, key) for key, cpu in window.items()), reverse=True)[:4]
            if busy and busy[0][0] > 0.33:
                cells = ", ".join(f"{key} {share:.0%}" for share, key in busy)
                out.write(f"{time.time():.1f} ({time.monotonic() - start:6.1f} s): {cells}\n")
                out.flush()
            window.clear()
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
