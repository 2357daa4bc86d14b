"""serve start-up and the first requests' TTFT against later ones, through the cluster: requests i, i+100 and i+200
have the same prompt length and sampling; prints each window's TTFT median and the median of the per-pair ratios."""
import os, random, statistics, subprocess, sys, time
from router.client import Client

model, label, port, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
path = f"/tmp/serve-{label}.log"
log = open(path, "w")
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-m", "scripts.cli", "serve", "--model", model, "--device", "cuda",
                         "--gpus-per-worker", "0.5", "--mode", mode, "--workers", "2", "--bind", f"tcp://127.0.0.1:{port}"],
                        stdout=log, stderr=subprocess.STDOUT)
try:
    while "serving on" not in open(path).read():
        assert proc.poll() is None, open(path).read()[-3000:]
        time.sleep(0.1)
    ready = time.monotonic() - t0
    ttft, rng = [], random.Random(1)
    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
        c.wait_ready(60)
        for i in range(220):
            shape = random.Random(i % 100)
            ids = [rng.randrange(1, 100000) for _ in range(shape.randint(20, 2000))]
            out = c.generate(ids, max_tokens=8, temperature=shape.choice([0.0, 0.7]), ignore_eos=True)
            ttft.append(out.timings.ttft * 1e3)
    if os.environ.get("EACH"):  # stop 33: each request's TTFT, the first 40 and 101-140
        print(f"{label} 1-40:    " + " ".join(f"{t:.1f}" for t in ttft[:40]))
        print(f"{label} 101-140: " + " ".join(f"{t:.1f}" for t in ttft[100:140]))
    w = [ttft[0:20], ttft[100:120], ttft[200:220]]
    med = [statistics.median(x) for x in w]
    pair = statistics.median(a / b for a, b in zip(w[0], w[1]))
    pair2 = statistics.median(a / b for a, b in zip(w[1], w[2]))
    print(f"{label}: ready in {ready:.1f} s; TTFT median 1-20 {med[0]:.2f}, 101-120 {med[1]:.2f}, 201-220 {med[2]:.2f} ms; "
          f"ratio of medians {med[0] / med[1]:.2f}; median per-pair ratio (i / i+100) {pair:.2f}, (i+100 / i+200) {pair2:.2f}")
finally:
    proc.send_signal(2)
    proc.wait(60)
