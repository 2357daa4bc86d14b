"""Which of the given top-level modules the GPU host's Python can find (without importing them): prints the
missing ones, to decide what a wheel set must carry there.

    python docs/gpu_runs/host_modules.py MODULE ...
"""
import importlib.util
import sys

missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]
print("host lacks:", " ".join(missing) or "nothing")
