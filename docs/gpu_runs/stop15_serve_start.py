"""serve start-up (cold / warm Triton cache) and first requests' TTFT against later ones, through the cluster."""
import os, random, re, statistics, subprocess, sys, time
from router.client import Client

model, label, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
mode = sys.argv[4] if len(sys.argv) > 4 else "disagg"
log = open(f"/tmp/serve-{label}.log", "w")
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", model, "--device", "cuda",
                         "--gpus-per-worker", "0.5", "--mode", mode, "--workers", "2", "--bind", f"tcp://127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
try:
    while "serving on" not in open(f"/tmp/serve-{label}.log").read():
        assert proc.poll() is None, open(f"/tmp/serve-{label}.log").read()[-3000:]
        time.sleep(0.1)
    ready = time.monotonic() - t0
    warm = [l for l in open(f"/tmp/serve-{label}.log") if "kernel warm-up" in l]
    ttft = []
    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
        c.wait_ready(60)
        for i in range(120):
            shape = random.Random(i % 100)
            ids = [random.randrange(1, 100000) for _ in range(shape.randint(20, 2000))]
            out = c.generate(ids, max_tokens=8, temperature=shape.choice([0.0, 0.7]), ignore_eos=True)
            ttft.append(out.timings.ttft)
    a, b = statistics.median(ttft[:20]) * 1e3, statistics.median(ttft[100:120]) * 1e3
    print(f"{label}: serve ready in {ready:.1f} s; TTFT median requests 1-20 {a:.2f} ms, 101-120 {b:.2f} ms, ratio {a / b:.2f}")
    for l in warm:
        print("   ", l.strip()[-110:])
finally:
    proc.send_signal(2)
    proc.wait(60)
