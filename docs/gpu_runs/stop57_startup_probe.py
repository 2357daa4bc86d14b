"""Stop 57 (issue 20): where `serve`'s own start goes before any worker starts, on the GPU host: the router's
construction (its imports, then `Router(...)`, under cProfile) and Ray's start, each in a fresh interpreter.
Usage: python docs/gpu_runs/stop57_startup_probe.py MODEL_DIR {router,ray} [NUM_CPUS]"""
import cProfile
import pstats
import sys
import time

model, what = sys.argv[1], sys.argv[2]
t0 = time.monotonic()
if what == "router":
    from router.config import RouterConfig
    from router.router import Router
    t1 = time.monotonic()
    prof = cProfile.Profile()
    prof.enable()
    router = Router(RouterConfig(model=model, bind="tcp://127.0.0.1:5790"))
    prof.disable()
    t2 = time.monotonic()
    heavy = sorted(m for m in ("torch", "triton", "transformers", "tokenizers", "jinja2") if m in sys.modules)
    print(f"router: imports {t1 - t0:.2f} s, Router() {t2 - t1:.2f} s; loaded: {heavy}")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    router.close()
else:
    import os

    import ray
    t1 = time.monotonic()
    cpus = int(sys.argv[3]) if len(sys.argv) > 3 else (os.cpu_count() or 1) + 1
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level="WARNING")
    t2 = time.monotonic()
    print(f"ray: import {t1 - t0:.2f} s, init (num_cpus={cpus}) {t2 - t1:.2f} s")
    ray.shutdown()
