"""Sums a py-spy raw profile (`py-spy record -f raw`) into the functions that take the most samples, inclusive and
self, counting only the stacks that pass through FRAME (default: every stack). For profiles too large to bring back
from the GPU host whole.

Run: python docs/gpu_runs/spy_summary.py PROFILE [FRAME] [TOP]
"""
from __future__ import annotations

import sys
from collections import Counter


def main() -> None:
    path, frame = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    own, inclusive, total = Counter(), Counter(), 0
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        if frame and frame not in stack:
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for f in set(frames):
            inclusive[f] += n
    print(f"{total} samples through {frame or 'any frame'}")
    for name, counter in (("inclusive", inclusive), ("self", own)):
        for f, n in counter.most_common(top):
            print(f"{100 * n / total:5.1f}% {name:9s} {f[:150]}")


if __name__ == "__main__":
    main()
